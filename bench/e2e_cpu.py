#!/usr/bin/env python3
"""End-to-end CPU generation benchmark: `flashlite generate` side by side with llama2.c's run.c on a llama2.c model
(stories260K by default), greedy, same prompt, same number of positions, runs interleaved, medians reported.

run.c is not part of this project: build it yourself outside the repository and pass its path with --llama2c-bin
(for example `gcc -Ofast -march=native run.c -lm`). Without it only the engine is measured.

Metrics. llama2.c prints "achieved tok/s" = (positions - 1) / time after the first position, processing the prompt one
token at a time. The engine reports decode tok/s (generated tokens / decode-step time, the number that matters for
generation), and end-to-end positions/s = (prompt + generated - 1) / total time, the closest analogue of llama2.c's.
"""
import argparse
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit():
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def run_engine(args, max_tokens):
    cmd = [args.flashlite, "generate", "--model", args.model, "--tokenizer", args.tokenizer, "--prompt", args.prompt,
           "--max-tokens", str(max_tokens), "--json", "--threads", str(args.threads)]
    out = json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout)
    s, o = out["stats"], out["outputs"][0]
    positions = len(o["prompt_ids"]) + len(o["ids"])
    return {"decode_tok_s": s["decode_tokens_per_s"], "ttft_ms": s["ttft_ms"], "mean_tbt_ms": s["mean_tbt_ms"],
            "e2e_positions_per_s": (positions - 1) / (s["total_ms"] / 1e3), "positions": positions,
            "generated": len(o["ids"]), "peak_rss_bytes": s["peak_rss_bytes"], "ids": o["ids"],
            "attention_kernel": s.get("attention_kernel", "?")}


def run_llama2c(args, steps):
    cmd = [args.llama2c_bin, args.model, "-z", args.tokenizer, "-t", "0", "-n", str(steps), "-i", args.prompt]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    m = re.search(r"achieved tok/s: ([0-9.]+)", proc.stdout + proc.stderr)
    return {"tok_s": float(m.group(1)), "text": proc.stdout.split("achieved")[0]}


def main():
    models = REPO.parent / "shared" / "models" / "stories260K"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashlite", default=os.environ.get("FLASHLITE_BIN", str(REPO / "build" / "bin" / "flashlite")))
    ap.add_argument("--llama2c-bin", help="a run.c build (outside this repository)")
    ap.add_argument("--llama2c-build", default="", help="how that run.c was built, recorded in the JSON")
    ap.add_argument("--model", default=str(models / "stories260K.bin"))
    ap.add_argument("--tokenizer", default=str(models / "tok512.bin"))
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--steps", type=int, default=512, help="total positions (prompt + generated), as run.c's -n")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu" / "e2e_stories260K.json"))
    args = ap.parse_args()

    probe = json.loads(subprocess.run([args.flashlite, "tokenize", "--model", args.tokenizer, "--text", args.prompt,
                                       "--json", "--bos"], capture_output=True, check=True).stdout)
    max_tokens = args.steps - probe["count"]
    engine, l2c = [], []
    for _ in range(args.repeats):  # interleaved so drift in the machine's speed hits both alike
        engine.append(run_engine(args, max_tokens))
        if args.llama2c_bin:
            l2c.append(run_llama2c(args, args.steps))
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    result = {
        "benchmark": "e2e_cpu", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": git_commit(),
        "device": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "model": pathlib.Path(args.model).name,
        "prompt": args.prompt, "steps": args.steps, "repeats": args.repeats,
        "engine": {k: med(engine, k) for k in ("decode_tok_s", "e2e_positions_per_s", "ttft_ms", "mean_tbt_ms",
                                               "peak_rss_bytes", "positions", "generated")},
    }
    if l2c:
        result["llama2c"] = {"tok_s": med(l2c, "tok_s"), "build": args.llama2c_build, "all": [r["tok_s"] for r in l2c]}
        result["ratio_decode_vs_llama2c"] = result["engine"]["decode_tok_s"] / result["llama2c"]["tok_s"]
        result["ratio_e2e_vs_llama2c"] = result["engine"]["e2e_positions_per_s"] / result["llama2c"]["tok_s"]
        # Same greedy text? (llama2.c prints the prompt too.)
        ours = subprocess.run([args.flashlite, "generate", "--model", args.model, "--tokenizer", args.tokenizer, "--prompt",
                               args.prompt, "--max-tokens", str(max_tokens), "--json"], capture_output=True, check=True)
        o = json.loads(ours.stdout)["outputs"][0]
        result["same_greedy_text_as_llama2c"] = (o["prompt"] + o["text"]).strip() == l2c[0]["text"].strip()
    result["engine"]["all_decode_tok_s"] = [r["decode_tok_s"] for r in engine]
    result["engine"]["attention_kernel"] = engine[0]["attention_kernel"]
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
