#!/usr/bin/env python3
"""A plot of bench/bwd/side_by_side.py's JSON: the backward's TFLOP/s against the sequence length, flashlite beside
SDPA's flash and cuDNN backends, one panel per (head_dim, causal). Written beside the JSON (same name, .png), which
the README's backward table shows.

    python3 bench/bwd/plot.py bench/results/h100/bwd_side_by_side.json
"""
import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PEERS = {"flashlite": ("flashlite", "tab:red", "o"), "flash": ("SDPA flash", "tab:blue", "^"),
         "cudnn": ("SDPA cuDNN", "tab:green", "v")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    args = ap.parse_args()
    path = pathlib.Path(args.json)
    d = json.loads(path.read_text())
    rows = [r for r in d["rows"] if r["window"] < 0]
    panels = sorted({(r["head_dim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    fig.suptitle(f"Backward, bf16, batch x seq = 16k, heads x head_dim = 2048 - {d['device']}, commit {d['commit']}",
                 fontsize=10)
    for ax, (dim, causal) in zip(axes[0], panels):
        mine = sorted((r for r in rows if (r["head_dim"], r["causal"]) == (dim, causal)), key=lambda r: r["seq"])
        for peer, (label, colour, marker) in PEERS.items():
            ax.plot([r["seq"] for r in mine], [r[peer]["bwd_tflops"] for r in mine], marker=marker, color=colour,
                    label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D {dim}, {'causal' if causal else 'full'}", fontsize=10)
        ax.set_xlabel("sequence length")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s (useful work)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
