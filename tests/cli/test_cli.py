"""The `flashlite` command line itself (no model needed): subcommand and argument errors that say what is wrong,
help texts, `bench cpu` pass-through, size limits checked before allocating, and progress shown only on a terminal."""
import json
import os
import pathlib
import pty
import subprocess
import time

import pytest

SUBCOMMANDS = ["attn", "info", "bench", "generate", "chat", "score", "tokenize"]


def run(binary, args, timeout=120):
    return subprocess.run([binary, *args], capture_output=True, timeout=timeout, text=True)


def test_help_lists_every_subcommand_with_a_description(flashlite_bin):
    out = run(flashlite_bin, ["--help"]).stdout
    for name in SUBCOMMANDS:
        line = next((l for l in out.splitlines() if l.split()[:1] == [name]), None)
        assert line is not None and len(line.split()) > 2, (name, out)


@pytest.mark.parametrize("args, word, choices", [
    (["foo"], "foo", SUBCOMMANDS),
    (["bench", "gpu"], "gpu", ["cpu"]),
])
def test_unknown_subcommand_is_named_with_the_choices(flashlite_bin, args, word, choices):
    proc = run(flashlite_bin, args)
    assert proc.returncode != 0
    assert f"unknown subcommand '{word}'" in proc.stderr and "A subcommand is required" not in proc.stderr, proc.stderr
    assert all(c in proc.stderr for c in choices), proc.stderr


@pytest.mark.parametrize("args", [[], ["bench"]])
def test_missing_subcommand_lists_the_choices(flashlite_bin, args):
    proc = run(flashlite_bin, args)
    assert proc.returncode != 0 and "needs a subcommand" in proc.stderr, proc.stderr
    assert ("attn" in proc.stderr and "tokenize" in proc.stderr) if not args else "cpu" in proc.stderr, proc.stderr


def test_attn_help_names_types_and_defaults_plainly(flashlite_bin):
    out = run(flashlite_bin, ["attn", "--help"]).stdout
    assert "--window L[,R]" in out, out
    assert "{false}" not in out and "--no-check " in out, out
    assert "179769" not in out and "0.000000" not in out, out


@pytest.mark.parametrize("args, message", [
    (["attn", "--softcap", "-1"], "--softcap: must be >= 0 (got -1)"),
    (["attn", "--softcap", "abc"], "--softcap: 'abc' is not a finite number"),
    (["attn", "--batch", "0"], "--batch: must be >= 1 (got 0)"),
    (["attn", "--batch", "2147483647"], "--batch: must be <= 1048576 (got 2147483647)"),
    (["attn", "--seq-q", "-5"], "--seq-q: must be >= 0 (got -5)"),
    (["attn", "--heads", "1.5"], "--heads: '1.5' is not an integer"),
    (["attn", "--window", "-2"], "--window: must be >= -1 (got -2)"),
    (["attn", "--sink-tokens", "-1"], "--sink-tokens: must be >= 0 (got -1)"),
    (["attn", "--seed", "-1"], "--seed: must be >= 0 (got -1)"),
    (["attn", "--seed", "99999999999999999999"], "--seed: '99999999999999999999' is too large"),
])
def test_range_errors_say_what_is_expected(flashlite_bin, args, message):
    proc = run(flashlite_bin, args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "179769" not in proc.stderr and len(proc.stderr) < 300, proc.stderr


def test_attn_seq_k_zero_means_no_keys(flashlite_bin):
    proc = run(flashlite_bin, ["attn", "--seq-q", "16", "--seq-k", "0", "--backend", "cpu", "--json"])
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["seq_q"] == 16 and r["seq_k"] == 0 and r["flops"] == 0 and r["passed"], r
    r = json.loads(run(flashlite_bin, ["attn", "--seq-q", "16", "--backend", "cpu", "--json"]).stdout)
    assert r["seq_k"] == 16, r  # absent: as --seq-q


@pytest.mark.parametrize("args, words", [
    (["--batch", "1048576", "--seq-q", "16777216"], ["--batch 1048576", "--seq-q 16777216", "memory is available"]),
    (["--heads", "4096", "--head-dim", "1024", "--seq-q", "16777216", "--no-check"], ["--heads 4096", "memory is available"]),
    (["--batch", "200000", "--seq-q", "20000", "--varlen"], ["--varlen", "int32", "2147483647"]),
    (["--heads", "6", "--kv-heads", "4"], ["--heads 6 is not a multiple of --kv-heads 4"]),
])
def test_attn_sizes_are_refused_before_allocating(flashlite_bin, args, words):
    t0 = time.monotonic()
    proc = run(flashlite_bin, ["attn", "--backend", "cpu", *args], timeout=60)
    assert proc.returncode != 0 and all(w in proc.stderr for w in words), proc.stderr
    assert time.monotonic() - t0 < 10, "the check must come before any allocation or work"


def bench_exe(flashlite_bin):
    exe = pathlib.Path(flashlite_bin).parent / "flashlite_bench_cpu"
    if not exe.exists():
        pytest.skip(f"{exe} is not built (FLASHLITE_BUILD_BENCH)")


@pytest.mark.parametrize("dashes", [[], ["--"]])
def test_bench_cpu_passes_its_arguments_through_in_order(flashlite_bin, dashes):
    bench_exe(flashlite_bin)
    proc = run(flashlite_bin, ["bench", "cpu", *dashes, "--max-seq", "5"])
    # flashlite_bench_cpu itself answers: it got "--max-seq 5", in this order, without the "--".
    assert proc.returncode == 2 and "flashlite_bench_cpu: --max-seq is '5'" in proc.stderr, proc.stderr


def test_bench_cpu_readme_form_runs(flashlite_bin, tmp_path):
    bench_exe(flashlite_bin)
    out = tmp_path / "cpu.json"
    proc = run(flashlite_bin, ["bench", "cpu", "--", "--quick", "--json", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["benchmark"], out.read_text()


# About 4 s of float64 reference check on a 2-core CI machine (the progress line appears after 2 s).
SLOW_CHECK = ["attn", "--seq-q", "1536", "--causal", "--heads", "4", "--repeat", "1", "--warmup", "0", "--backend", "cpu"]


def run_with_stderr_on_a_terminal(args):
    main, sub = pty.openpty()
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=sub)
    os.close(sub)
    err = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.communicate(timeout=300)[0]
    os.close(main)
    return proc.returncode, out, err.decode(errors="replace"), time.monotonic() - t0


def test_progress_shows_on_a_terminal_only(flashlite_bin):
    rc, out, err, seconds = run_with_stderr_on_a_terminal([flashlite_bin, *SLOW_CHECK])
    assert rc == 0, err
    if seconds < 3:
        pytest.skip(f"the check took {seconds:.1f} s here: too quick for a progress line")
    assert "checking against the float64 reference" in err and "%" in err, err
    assert b"\r" not in out and b"%" not in out, out  # stdout (a pipe) holds the report only
    piped = subprocess.run([flashlite_bin, *SLOW_CHECK], capture_output=True, timeout=300)
    assert piped.returncode == 0 and piped.stderr == b"", piped.stderr
    assert b"\r" not in piped.stdout and b"reference:" not in piped.stdout, piped.stdout


def test_info_names_what_tensor_parallelism_can_use(flashlite_bin):
    out = run(flashlite_bin, ["info"]).stdout
    line = next((l for l in out.splitlines() if l.startswith("tensor parallelism (--tp): ")), None)
    assert line is not None and "cpu (in-process)" in line, out
    assert "cuda: not in this build" in line or "NCCL" in line, line
