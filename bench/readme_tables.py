#!/usr/bin/env python3
"""Renders the README's results tables from the committed JSON, so that every number there names its device and
commit and comes from a file in bench/results/. Each table sits between `<!-- table:NAME -->` and
`<!-- /table:NAME -->` in README.md (or the document TARGETS names); this script rewrites what is between them,
title line included.

    python3 bench/readme_tables.py           # rewrite README.md and the documents of TARGETS
    python3 bench/readme_tables.py --check   # exit 1 when one differs from what the JSON renders (a test)
"""
import json
import pathlib
import re
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# The files each table is rendered from (relative to bench/results). Update these when a new measurement lands.
SOURCES = {
    "fwd": "h100/fwd_side_by_side.json",
    "decode": ("h100/decode_round14/decode_ed95b32.json", "h100/decode_round14/sdpa_decode_ed95b32.json"),
    "engine": "h200/e2e.json",
    "cpu": "cpu/bench_cpu.json",
    "bwd": "h200/bwd_side_by_side.json",
    "train": ("h100/train.json", tuple(f"h100/train_seeds/llama_seed{s}.json" for s in range(1, 6)),
              "h100/train_curves.png"),
    "train_amp": ("h200/train_amp/train_amp.json", ("h200/train_amp/llama_amp_seed1.json",
                                                    "h200/train_amp/llama_amp_seed2.json"),
                  "h200/train_amp/train_amp_curves.png"),
    "tp": ("h100-x4/e2e_tp.json", "h100-x4/e2e_tp_prompt4096.json"),
    "serve": ("h100/serve_load.json", "h100/serve_engine_baseline.json"),
    "serve_steady": "h100-x4/serve_c64_145c63d.json",
}


def load(rel):
    data = json.loads((RESULTS / rel).read_text())
    for key in ("commit",):
        if not data.get(key):
            raise SystemExit(f"bench/results/{rel}: no '{key}' field; every README number must name its commit")
    return data


def short(commit):
    """The commit id as the JSON gives it, shortened to 7 hex digits when it is a bare id."""
    c = str(commit).strip()
    return c[:7] if re.fullmatch(r"[0-9a-f]{8,40}", c) else c


def source_line(rel, data, device):
    return f"{device}, commit {short(data['commit'])}, `bench/results/{rel}`."


def table_fwd():
    rel = SOURCES["fwd"]
    d = load(rel)
    seqs = sorted({r["seq"] for r in d["rows"]})
    lines = [source_line(rel, d, d["device"]) + f" torch {d.get('torch', '?')}; bf16, batch x seq = 16384, "
             "heads x head_dim = 2048, every backend on the same tensors in one process. Each cell: flashlite's "
             "TFLOP/s of useful work (causal counts half), then its speed relative to SDPA's flash (FlashAttention-2) "
             "and cuDNN backends (> 1: flashlite faster).", "",
             "| D, mask | " + " | ".join(f"S {s}" for s in seqs) + " |",
             "|---|" + "---:|" * len(seqs)]
    by = {(r["head_dim"], r["causal"], r["seq"]): r for r in d["rows"]}
    for dim, causal in sorted({(r["head_dim"], r["causal"]) for r in d["rows"]}):
        cells = []
        for s in seqs:
            r = by.get((dim, causal, s))
            if not r:
                cells.append("-")
                continue
            fl = r["flashlite"]["tflops"]
            cells.append(f"{fl:.0f}, {fl / r['sdpa_flash']['tflops']:.2f}x / {fl / r['sdpa_cudnn']['tflops']:.2f}x")
        lines.append(f"| {dim}, {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    return lines


# Dense bf16 tensor peak (TFLOP/s) and HBM bandwidth (TB/s) by device, from the vendors' data sheets.
PEAKS = {"H100": (989.0, 3.35), "H200": (989.0, 4.8)}


def table_roofline():
    """The forward table's shapes against the roofline: a call must move q, k, v and out at least once (8 B H S D
    bytes in bf16) for 4 B H S^2 D FLOPs (half causal), so its arithmetic intensity is S / 2 FLOP/B (S / 4 causal)
    whatever D; the roof is min(tensor peak, bandwidth x intensity)."""
    rel = SOURCES["fwd"]
    d = load(rel)
    peak, bw = next(v for k, v in PEAKS.items() if k in d["device"])
    seqs = sorted({r["seq"] for r in d["rows"]})
    roof = {(s, c): min(peak, bw * (s / 4 if c else s / 2)) for s in seqs for c in (False, True)}
    lines = [source_line(rel, d, d["device"]) + f" Roof: min({peak:.0f} TFLOP/s, {bw} TB/s x intensity), intensity "
             "S / 2 FLOP/B (S / 4 causal) of the minimal traffic (q, k, v, out once). Each cell: flashlite's and "
             "cuDNN's TFLOP/s as % of the roof.", "",
             "| D, mask | " + " | ".join(f"S {s}" for s in seqs) + " |",
             "|---|" + "---:|" * len(seqs),
             "| roof, full | " + " | ".join(f"{roof[(s, False)]:.0f}" for s in seqs) + " |",
             "| roof, causal | " + " | ".join(f"{roof[(s, True)]:.0f}" for s in seqs) + " |"]
    by = {(r["head_dim"], r["causal"], r["seq"]): r for r in d["rows"]}
    for dim, causal in sorted({(r["head_dim"], r["causal"]) for r in d["rows"]}):
        cells = []
        for s in seqs:
            r = by.get((dim, causal, s))
            rf = roof[(s, causal)]
            cells.append("-" if not r else
                         f"{100 * r['flashlite']['tflops'] / rf:.0f}% / {100 * r['sdpa_cudnn']['tflops'] / rf:.0f}%")
        lines.append(f"| {dim}, {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    return lines


def table_decode():
    rel, rel_sdpa = SOURCES["decode"]
    d, s = load(rel), load(rel_sdpa)
    bw = d["read_bw_tbps"] * 1e12
    sdpa = {(r["batch"], r["kv_len"]): r for r in s["rows"] if r.get("peer") == "sdpa_cudnn"}
    main = {(r["batch"], r["kv_len"]): r for r in d["rows"]
            if r.get("kind") == "main" and r.get("layout") == "contiguous" and r.get("q_len") == 1}
    paged = {(r["batch"], r["kv_len"]): r for r in d["rows"]
             if r.get("layout") == "paged" and r.get("page_size") == 16 and r.get("q_len") == 1}
    extra = [100 * (paged[k]["us_graph"] / main[k]["us_graph"] - 1) for k in main if k in paged]
    paged_note = (f" Paged caches (16-token pages) take {min(extra):.0f}-{max(extra):.0f}% longer." if extra else "")
    lens = sorted({k[1] for k in main})
    lines = [source_line(rel, d, d["device"]) + f" SDPA (torch {s.get('torch', '?')}, cuDNN backend) from the same "
             f"device call, `bench/results/{rel_sdpa}`. Hq 32, Hkv 8, D 128, bf16, one query token, contiguous cache; "
             f"us per call replayed from a CUDA graph as the engine runs it, in brackets % of the read bandwidth "
             f"measured in the same run ({d['read_bw_tbps']:.2f} TB/s).{paged_note}", "",
             "| batch | " + " | ".join(f"kv {n}: flashlite | SDPA cuDNN" for n in lens) + " |",
             "|---:|" + "---:|---:|" * len(lens)]
    for batch in sorted({k[0] for k in main}):
        cells = []
        for n in lens:
            r, c = main.get((batch, n)), sdpa.get((batch, n))
            cells.append(f"{r['us_graph']:.1f} ({r['pct_read_bw_graph']:.0f}%)" if r else "-")
            cells.append(f"{c['us_graph']:.1f} ({100 * r['kv_bytes'] / (c['us_graph'] * 1e-6) / bw:.0f}%)"
                         if c and r else "-")
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    return lines


def table_engine():
    rel = SOURCES["engine"]
    d = load(rel)
    lines = [source_line(rel, d, d["device"]) + " Random Llama-3.2-1B-shaped checkpoint, bf16, 128 new greedy "
             f"tokens (bench/e2e.py); decode floor: {d['weight_bytes'] / 1e9:.2f} GB of weights per step at the "
             f"copy bandwidth measured in the same call ({d['copy_bandwidth_gb_s']:.0f} GB/s).", "",
             "| batch | prompt | TTFT ms | ms per step | decode tok/s | % of copy bandwidth |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(d["rows"], key=lambda r: (r["batch"], r["prompt"])):
        f = r["flashlite"]
        lines.append(f"| {r['batch']} | {r['prompt']} | {f['ttft_ms']:.1f} | {f['tbt_ms']:.2f} | "
                     f"{f['decode_tok_s']:,.0f} | {100 * f['fraction_of_copy_bw']:.0f}% |")
    return lines


def table_cpu():
    rel = SOURCES["cpu"]
    d = load(rel)
    lines = [f"{d['cpu_model']}, {d['threads']} threads, {d['simd_variant']} kernels, commit {short(d['commit'])}, "
             f"`bench/results/{rel}` (`flashlite bench cpu`); fp32, B 1, H 8, D 64, S >= 512; % of the FMA peak measured in "
             f"the same run ({d['fma_peak_gflops']:.0f} GFLOP/s); load average at the start "
             f"{d.get('load_average_start', '?')}.", "",
             "| S | naive ms | cpu (tiled) ms | cpu GFLOP/s (% peak) | speed-up | causal: naive / cpu ms | "
             "extra memory naive / cpu MiB |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    by = {}
    for r in d["rows"]:  # the cpu rows of every instruction set; the table shows the one the machine runs by default
        if r["backend"] == "naive" or r.get("simd", d["simd_variant"]) == d["simd_variant"]:
            by.setdefault((r["seq"], r["causal"]), {})[r["backend"]] = r
    for seq in sorted({s for s, _ in by if s >= 512}):  # shorter rows time thread start-up, not the kernels
        n, t = by.get((seq, False), {}).get("naive"), by.get((seq, False), {}).get("cpu")
        if not (n and t):
            continue
        c = by.get((seq, True), {})
        causal = (f"{c['naive']['median_ms']:.1f} / {c['cpu']['median_ms']:.1f}" if "naive" in c and "cpu" in c
                  else "-")
        lines.append(f"| {seq} | {n['median_ms']:.1f} | {t['median_ms']:.2f} | {t['gflops']:.1f} "
                     f"({t['pct_of_fma_peak']:.0f}%) | {n['median_ms'] / t['median_ms']:.1f}x | {causal} | "
                     f"{n['extra_peak_rss_mib']:.1f} / {t['extra_peak_rss_mib']:.1f} |")
    return lines


def table_bwd():
    rel = SOURCES["bwd"]
    d = load(rel)
    rows = [r for r in d["rows"] if r["window"] < 0]
    seqs = sorted({r["seq"] for r in rows})
    win = [r for r in d["rows"] if r["window"] >= 0]
    extra = "".join(f" Causal window {r['window']} + {r['sink_tokens']} sink tokens, D {r['head_dim']}, S {r['seq']}: "
                    f"{r['flashlite']['bwd_tflops']:.0f} against FlexAttention's {r['flex']['bwd_tflops']:.0f} "
                    f"({r['flashlite']['bwd_tflops'] / r['flex']['bwd_tflops']:.2f}x)."
                    for r in win)
    lines = [source_line(rel, d, d["device"]) + f" torch {d.get('torch', '?')}; bf16, batch x seq = 16384, heads x "
             "head_dim = 2048; the backward alone through each one's autograd, its GPU time "
             "(queued behind a GPU sleep, so host latency does not count). Each cell: flashlite's TFLOP/s of "
             "useful work (2.5x the forward's), then its speed relative to SDPA's flash and cuDNN backends." + extra, "",
             "| D, mask | " + " | ".join(f"S {s}" for s in seqs) + " |", "|---|" + "---:|" * len(seqs)]
    by = {(r["head_dim"], r["causal"], r["seq"]): r for r in rows}
    for dim, causal in sorted({(r["head_dim"], r["causal"]) for r in rows}):
        cells = []
        for s in seqs:
            r = by[(dim, causal, s)]
            f = r["flashlite"]["bwd_tflops"]
            cells.append(f"{f:.0f}, {f / r['flash']['bwd_tflops']:.2f}x / {f / r['cudnn']['bwd_tflops']:.2f}x")
        lines.append(f"| {dim}, {'causal' if causal else 'full'} | " + " | ".join(cells) + " |")
    # forward + backward and the peak memory of one call, at the longest S where every peer has them
    s = max(x for x in seqs if all("fwd_bwd_ms" in by[k][p] for k in by if k[2] == x for p in ("flashlite", "flash",
                                                                                               "cudnn")))
    lines += ["", f"Forward + backward at S {s}, ms, and the peak memory a call adds, MiB (flashlite / SDPA flash / "
              "cuDNN):", "", "| D, mask | forward + backward ms | peak MiB |", "|---|---:|---:|"]
    for dim, causal in sorted({(r["head_dim"], r["causal"]) for r in rows}):
        r = by[(dim, causal, s)]
        ms = " / ".join(f"{r[p]['fwd_bwd_ms']:.2f}" for p in ("flashlite", "flash", "cudnn"))
        mib = " / ".join(f"{r[p]['peak_mib']:,.0f}" for p in ("flashlite", "flash", "cudnn"))
        lines.append(f"| {dim}, {'causal' if causal else 'full'} | {ms} | {mib} |")
    lines += ["", f"![backward TFLOP/s](bench/results/{rel.rsplit('.', 1)[0]}.png)"]
    return lines


def table_train(name="train"):
    rel, more_seeds, curves = SOURCES[name]
    d = load(rel)
    dtype = "mixed precision (float32 weights, bf16 autocast)" if d["dtype"] == "amp" else d["dtype"]
    lines = [source_line(rel, d, d["device"]) + f" {d['steps']} steps, {dtype}, batch {d['batch']} x {d['seq']} "
             f"bytes of {d['data'].split(' (')[0]}, same seed and data order; final loss: the mean of the last 50 "
             f"steps; curves: `bench/results/{curves}`.", "",
             "| model | final loss: flashlite / reference | noise floor | tokens/s: flashlite / reference | peak MiB |",
             "|---|---:|---:|---:|---:|"]
    for r in d["results"]:
        f, ref = r["runs"][0], r["runs"][1]
        # noise floor: a third exact implementation (the llama runs' eager attention) against the same reference, and
        # the reference run again (its own nondeterminism)
        floors = []
        if "final_loss_baseline" in r:
            pct = 100 * (r["final_loss_baseline"] / r["final_loss_reference"] - 1)
            floors.append(f"{r['runs'][2]['impl']} {pct:+.2f}%")
        if "final_loss_rerun" in r:
            floors.append(f"rerun {100 * (r['final_loss_rerun'] / r['final_loss_reference'] - 1):+.2f}%")
        floor = ", ".join(floors)
        lines.append(f"| {r['arch']} ({r['params'] / 1e6:.0f}M) vs {r['reference']} | {r['final_loss_flite']:.4f} / "
                     f"{r['final_loss_reference']:.4f} ({100 * (r['final_loss_flite'] / r['final_loss_reference'] - 1):+.2f}%) | "
                     f"{floor} | {f['tokens_per_s']:,.0f} / {ref['tokens_per_s']:,.0f} | {f['peak_memory_mib']:,.0f} / "
                     f"{ref['peak_memory_mib']:,.0f} |")
    # The same runs from other seeds: flashlite's and the noise floor's final loss against the reference, per seed.
    seeds = [d] + [load(r) for r in more_seeds]
    for arch in sorted({r["arch"] for s in seeds for r in s["results"]}):
        per = [(s["seed"], s["commit"], r) for s in seeds for r in s["results"] if r["arch"] == arch]
        if len(per) < 2:
            continue
        def rel_pcts(key):
            pct = [100 * (r[key] / r["final_loss_reference"] - 1) for _, _, r in per if key in r]
            spread = (f" (mean {statistics.mean(pct):+.2f}%, standard deviation {statistics.stdev(pct):.2f}%)"
                      if len(pct) > 3 else "")
            return " / ".join(f"{x:+.2f}%" for x in pct) + spread if pct else ""
        flite, base = rel_pcts("final_loss_flite"), rel_pcts("final_loss_baseline")
        rerun = rel_pcts("final_loss_rerun")
        lines += ["", f"{arch}, seeds {' / '.join(str(s) for s, _, _ in per)} (commits "
                  f"{' / '.join(short(c) for _, c, _ in per)}; `{rel}` and `{'`, `'.join(more_seeds)}`): final loss "
                  f"against {per[0][2]['reference']}, flashlite {flite}" + (f"; {per[0][2]['runs'][2]['impl']} {base}"
                                                                           if base else "")
                  + (f"; the reference again {rerun}" if rerun else "") + "."]
    return lines


def table_tp():
    rel, rel4k = SOURCES["tp"]
    d, d4k = load(rel), load(rel4k)
    tps = sorted({r["tp"] for r in d["rows"]})
    by = {(r["tp"], r["batch"]): r for r in d["rows"]}
    ttft4k = {r["tp"]: r["flashlite"]["ttft_ms"] for r in d4k["rows"]}
    lines = [source_line(rel, d, f"{d['gpus']}x {d['device']}") + f" Random Llama-3-8B-shaped checkpoint, bf16 "
             f"({d['weight_bytes'] / 1e9:.2f} GB), prompt {d['rows'][0]['prompt']}, {d['rows'][0]['new_tokens']} new greedy tokens; TTFT at "
             f"prompt 4096 from `bench/results/{rel4k}`. Decode tok/s, in brackets the speed-up over TP 1 and, at TP 1, "
             "the share of the copy bandwidth measured in the same call.", "",
             "| | " + " | ".join(f"TP {t}" for t in tps) + " |", "|---|" + "---:|" * len(tps)]
    for b in sorted({r["batch"] for r in d["rows"]}):
        cells = []
        for t in tps:
            f = by[(t, b)]["flashlite"]
            note = f"{f['fraction_of_copy_bw']:.0%} of copy bw" if t == 1 else f"{by[(t, b)]['decode_speedup_vs_tp1']:.2f}x"
            cells.append(f"{f['decode_tok_s']:,.0f} ({note})")
        lines.append(f"| batch {b}, tok/s | " + " | ".join(cells) + " |")
    lines.append(f"| batch 1, TTFT prompt {d['rows'][0]['prompt']} | " +
                 " | ".join(f"{by[(t, 1)]['flashlite']['ttft_ms']:.1f} ms" for t in tps) + " |")
    lines.append("| batch 1, TTFT prompt 4096 | " + " | ".join(f"{ttft4k[t]:.0f} ms" for t in tps) + " |")
    return lines


def table_serve():
    rel, rel_base = SOURCES["serve"]
    d, base = load(rel), load(rel_base)
    step = {r["batch"]: r["flashlite"] for r in base["rows"]}
    lines = [source_line(rel, d, base["device"]) + f" `flashlite serve --device {d['device']} --max-batch "
             f"{d['max_batch']}`, random Llama-3.2-1B-shaped bf16 checkpoint, streamed /v1/completions of "
             f"{d['output_tokens'][0]}-{d['output_tokens'][1]} tokens (bench/serve/load.py); the engine's static "
             f"batches on the same checkpoint from `bench/results/{rel_base}`: "
             + ", ".join(f"batch {b} {s['tbt_ms']:.2f} ms per step ({s['decode_tok_s']:,.0f} tok/s)"
                         for b, s in sorted(step.items())) + ".", "",
             "| load | output tok/s | TTFT p50 / p90 ms | ITL p50 / p90 ms | mean batch |",
             "|---|---:|---:|---:|---:|"]
    for r in d["rows"]:
        load_name = f"{r['concurrency']} client{'s' * (r['concurrency'] > 1)}" if r["mode"] == "concurrency" else f"Poisson {r['rate']:g} req/s"
        lines.append(f"| {load_name} | {r['output_tok_s']:,.0f} | {r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p90']:.1f} | "
                     f"{r['itl_ms']['p50']:.2f} / {r['itl_ms']['p90']:.2f} | {r.get('mean_batch', 0):.1f} |")
    return lines


def table_serve_steady():
    rel = SOURCES["serve_steady"]
    d = load(rel)
    base = d["static_batch64"]["flashlite"]
    lines = [source_line(rel, d, d["device"]) + f" {len(d['rounds'])} rounds of {d['rounds'][0]['requests']:,} "
             f"requests at {d['rounds'][0]['concurrency']} clients (the ramp and the drain weigh little), beside the "
             f"engine's static batch 64 in the same call: {base['decode_tok_s']:,.0f} tok/s, {base['tbt_ms']:.2f} ms "
             "per step.", "",
             "| round | output tok/s | of static batch 64 | TTFT p50 / p90 ms | ITL p50 ms | mean batch "
             "| step / forward ms |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["rounds"]:
        lines.append(f"| {r['round']} | {r['output_tok_s']:,.0f} | {r['fraction_of_static_batch64']:.1%} | "
                     f"{r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p90']:.1f} | {r['itl_ms']['p50']:.2f} | "
                     f"{r['mean_batch']:.1f} | {r['server_step_ms']:.2f} / {r['server_forward_ms']:.2f} |")
    return lines


RENDERERS = {"fwd": table_fwd, "decode": table_decode, "engine": table_engine, "cpu": table_cpu, "bwd": table_bwd,
             "train": table_train, "train_amp": lambda: table_train("train_amp"), "tp": table_tp, "serve": table_serve, "serve_steady": table_serve_steady,
             "roofline": table_roofline}

# Each table's first line starts with its title and the benchmark that measured it.
TITLES = {
    "fwd": "**Fused forward** (bench/fwd/side_by_side.py):",
    "roofline": "**Fused forward on the roofline** (bench/fwd/side_by_side.py):",
    "decode": "**Decode** (bench/decode):",
    "engine": "**Engine, CUDA** (bench/e2e.py):",
    "bwd": "**Backward** (bench/bwd/side_by_side.py):",
    "train": "**Training** (bench/train.py):",
    "train_amp": "**Training, mixed precision** (bench/train.py --dtype amp):",
    "tp": "**Tensor parallelism** (bench/e2e.py --tp):",
    "serve": "**Server under load** (bench/serve/load.py):",
    "serve_steady": "**Server in steady state** (bench/serve/load.py --concurrency 64 --requests 1024):",
    "cpu": "**CPU** (`flashlite bench cpu --json`):",
}

# Tables rendered into a document other than README.md (relative to the repository root).
TARGETS = {"train": "docs/backward.md", "train_amp": "docs/backward.md", "roofline": "docs/performance.md"}


def render(text, names, doc="README.md"):
    for name in names:
        pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(<!-- /table:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{doc} has no <!-- table:{name} --> ... <!-- /table:{name} --> block")
        lines = RENDERERS[name]()
        body = "\n".join([f"{TITLES[name]} {lines[0]}"] + lines[1:]) + "\n"
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def main(argv):
    if argv[1:] not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    check = argv[1:] == ["--check"]
    status = 0
    for doc in dict.fromkeys(["README.md", *TARGETS.values()]):
        path = ROOT / doc
        old = path.read_text()
        new = render(old, [n for n in RENDERERS if TARGETS.get(n, "README.md") == doc], doc)
        if check:
            if new != old:
                print(f"{doc} tables differ from bench/results JSON: run python3 bench/readme_tables.py",
                      file=sys.stderr)
                status = 1
        else:
            path.write_text(new)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
