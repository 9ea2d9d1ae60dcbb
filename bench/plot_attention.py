#!/usr/bin/env python3
"""Plots of bench/attention.py's JSON: TFLOP/s vs sequence length per backend, speedup over the naive torch path,
and peak memory vs sequence length (log scale), one panel per (head_dim, causal) of the reference shapes.

    python3 bench/plot_attention.py bench/results/h100/attention.json --out bench/results/h100
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # backend: (label, colour, marker)
    "flashlite_cuda": ("flashlite cuda (fused)", "tab:red", "o"),
    "flashlite_naive": ("flashlite naive (split kernels)", "tab:orange", "s"),
    "sdpa_flash": ("SDPA flash", "tab:blue", "^"),
    "sdpa_cudnn": ("SDPA cuDNN", "tab:green", "v"),
    "sdpa_efficient": ("SDPA efficient", "tab:purple", "D"),
    "flex": ("FlexAttention", "tab:brown", "P"),
    "torch_naive": ("torch matmul-softmax-matmul", "tab:gray", "x"),
}


def _panels(rows):
    ref = [r for r in rows if r.get("group") == "reference" and r.get("status") == "ok"]
    keys = sorted({(r["head_dim"], r["causal"]) for r in ref})
    return ref, keys


def _figure(result, title, keys):
    cols = min(2, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 4.4 * rows), squeeze=False)
    fig.suptitle(f"{title} - {result['device']}, torch {result['torch']}, commit {result['commit']}", fontsize=10)
    return fig, axes.ravel()


def _series(ax, ref, key, value):
    d, causal = key
    for backend, (lab, col, mk) in STYLE.items():
        pts = sorted((r["seq"], value(r)) for r in ref
                     if r["backend"] == backend and (r["head_dim"], r["causal"]) == key and value(r) is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=mk, color=col, label=lab)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (batch x seq = 16384 tokens)")
    ax.set_title(f"head_dim {d}, {'causal' if causal else 'non-causal'}, bf16, {2048 // d} heads", fontsize=9)
    ax.grid(alpha=0.3)


def plot_all(result, outdir):
    os.makedirs(outdir, exist_ok=True)
    ref, keys = _panels(result["rows"])
    if not keys:
        return []
    paths = []

    fig, axes = _figure(result, "Attention forward TFLOP/s", keys)
    for ax, key in zip(axes, keys):
        _series(ax, ref, key, lambda r: r["tflops"])
        ax.set_ylabel("TFLOP/s")
        ax.axhline(result["ceilings"]["matmul_bf16_8192_tflops"], color="k", ls=":", lw=1)
        ax.text(ax.get_xlim()[0], result["ceilings"]["matmul_bf16_8192_tflops"], " bf16 matmul ceiling",
                va="bottom", fontsize=7)
    axes[0].legend(fontsize=7)
    paths.append(os.path.join(outdir, "attention_tflops.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)

    fig, axes = _figure(result, "Speedup over torch matmul-softmax-matmul", keys)
    for ax, key in zip(axes, keys):
        _series(ax, ref, key, lambda r: r.get("speedup_vs_torch_naive"))
        ax.set_ylabel("speedup (x)")
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    paths.append(os.path.join(outdir, "attention_speedup.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)

    fig, axes = _figure(result, "Peak memory of one call (beyond the inputs)", keys)
    for ax, key in zip(axes, keys):
        _series(ax, ref, key, lambda r: r["peak_mem_bytes"] / 2 ** 20 if r.get("peak_mem_bytes") else None)
        ax.set_ylabel("MiB")
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    paths.append(os.path.join(outdir, "attention_memory.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close("all")
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    with open(args.json) as fh:
        result = json.load(fh)
    for p in plot_all(result, args.out):
        print(p)


if __name__ == "__main__":
    main()
