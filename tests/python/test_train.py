"""The training run of bench/train.py, short and on the CPU (what the GPU run does for 500 steps in bf16): tiny
Llama (GQA) and GPT-OSS (sliding window, learned sinks, experts) models trained on real English text with
attn_implementation="flite" and with the reference ("sdpa" / "eager"), same seed and data: the loss curves agree step by
step and go down."""
import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _train_module():
    spec = importlib.util.spec_from_file_location("flashlite_bench_train", ROOT / "bench" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
def test_short_training_run_matches_reference(arch):
    out = _train_module().main(["--arch", arch, "--device", "cpu", "--dtype", "fp32", "--steps", "8", "--tiny",
                                "--batch", "2", "--seq", "64", "--average", "2"])
    (r,) = out["results"]
    flite, ref = (x["losses"] for x in r["runs"])
    assert len(flite) == len(ref) == 8
    for step, (a, b) in enumerate(zip(flite, ref)):
        assert abs(a - b) <= 1e-4 * b, f"step {step}: loss {a} on flite, {b} on {r['reference']}"
    assert flite[-1] < flite[0] - 0.2, f"the loss did not go down: {flite}"


def test_short_mixed_precision_run_matches_reference():
    """--dtype amp (float32 weights, bf16 autocast): the run works on flite and its losses follow sdpa's within bf16
    noise."""
    out = _train_module().main(["--arch", "llama", "--device", "cpu", "--dtype", "amp", "--steps", "8", "--tiny",
                                "--batch", "2", "--seq", "64", "--average", "2"])
    (r,) = out["results"]
    flite, ref = (x["losses"] for x in r["runs"])
    for step, (a, b) in enumerate(zip(flite, ref)):
        assert abs(a - b) <= 2e-2 * b, f"step {step}: loss {a} on flite, {b} on {r['reference']}"
    assert flite[-1] < flite[0] - 0.2, f"the loss did not go down: {flite}"


def test_rerun_repeats_the_reference_and_cosine_schedule_is_recorded():
    """--rerun: a last run of the reference itself, its distance from the first (0 here: sdpa on the CPU has no
    atomics); --schedule cosine: warm-up, then the decay, recorded in the JSON."""
    mod = _train_module()
    out = mod.main(["--arch", "llama", "--device", "cpu", "--dtype", "fp32", "--steps", "4", "--tiny", "--batch", "2",
                    "--seq", "32", "--average", "2", "--rerun", "--schedule", "cosine", "--warmup", "2"])
    (r,) = out["results"]
    assert [x["impl"] for x in r["runs"]] == ["flite", "sdpa", "sdpa"] and r["runs"][-1]["rerun"]
    assert r["rerun_identical"] and r["final_loss_rerun_rel_diff"] == 0.0
    assert r["runs"][0]["losses"] != r["runs"][1]["losses"]  # (so that a rerun of flite could not pass for sdpa's)
    assert (out["schedule"], out["warmup"]) == ("cosine", 2)
    assert [mod.lr_factor(s, 10, "cosine", 2) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, pytest.approx(0.1)]


def test_hf_batches_bench_runs_flashlite_on_each_batch_kind():
    """bench/hf_batches.py, tiny and on the CPU: the unpadded, right-padded and packed batches run flashlite on every
    layer (no fallback), with the same loss as sdpa (float32)."""
    spec = importlib.util.spec_from_file_location("flashlite_bench_hf_batches", ROOT / "bench" / "hf_batches.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--tiny", "--device", "cpu", "--batch", "3", "--seq", "96", "--layers", "2", "--repeats", "1"])
    assert [r["kind"] for r in out["rows"]] == ["full", "padded", "packed"]
    for r in out["rows"]:
        assert r["flite"]["fallback_calls"] == 0, r["kind"]
        assert abs(r["flite"]["loss"] - r["sdpa"]["loss"]) <= 1e-4 * r["sdpa"]["loss"], r


def test_cpu_backward_bench_matches_torch(tmp_path):
    """bench/bwd/cpu_side_by_side.py on short shapes: flashlite's CPU gradients (through autograd) equal torch SDPA's
    in float32, and every path is timed."""
    path = ROOT / "bench" / "bwd" / "cpu_side_by_side.py"
    spec = importlib.util.spec_from_file_location("flashlite_bench_bwd_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--shapes", "130:0,96:1", "--rounds", "1", "--reps", "1", "--out", str(tmp_path / "bwd_cpu.json")])
    assert [(r["seq"], r["causal"]) for r in out["rows"]] == [(130, False), (96, True)]
    for r in out["rows"]:
        assert r["max_abs_grad_diff"] < 1e-4, r
        assert r["grad_rel_err_vs_float64"]["flashlite"] < 1e-5, r
        assert all(r[p]["ms"] > 0 for p in ("flashlite_fwd_bwd", "sdpa_fwd_bwd", "flashlite_bwd")), r
