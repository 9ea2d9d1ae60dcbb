"""Plots of the fused forward results (plain SVG, no plotting library needed): TFLOP/s against sequence length for
flashlite's dispatched kernel and torch SDPA's flash / cuDNN backends, and a roofline with the measured points.

    python3 bench/fwd/plots.py bench/results/h100/fwd_sweep.json bench/results/h100/ [fwd_side_by_side.json]
"""
import json
import math
import sys

W, H, L, R, T, B = 640, 400, 70, 20, 30, 50  # canvas and margins


def svg(elements, title):
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">'
    return "\n".join([head, '<rect width="100%" height="100%" fill="white"/>',
                      f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>', *elements, "</svg>"])


def axes(xs, ys, xlabel, ylabel, xlog=True, ylog=False):
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys), max(ys)) if ylog else (0, max(ys) * 1.1)
    fx = (lambda v: math.log(v)) if xlog else (lambda v: v)
    fy = (lambda v: math.log(v)) if ylog else (lambda v: v)
    px = lambda v: L + (fx(v) - fx(x0)) / (fx(x1) - fx(x0)) * (W - L - R)
    py = lambda v: H - B - (fy(v) - fy(y0)) / (fy(y1) - fy(y0)) * (H - T - B)
    el = [f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
          f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
          f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>',
          f'<text x="14" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 14 {(T + H - B) / 2})">{ylabel}</text>']
    return el, px, py, (x0, x1, y0, y1)


def tflops_plot(data, d, causal, path, sbs=None):
    if sbs:  # side_by_side.json: one process, same tensors, interleaved rounds
        rows = [{"seq": r["seq"], "dispatch_tflops": r["flashlite"]["tflops"], "sdpa_flash_tflops": r["sdpa_flash"]["tflops"],
                 "sdpa_cudnn_tflops": r["sdpa_cudnn"]["tflops"]}
                for r in sbs["rows"] if r["head_dim"] == d and r["causal"] == causal]
    else:
        rows = [r for r in data["summary"] if r["head_dim"] == d and r["causal"] == causal and r["window_left"] < 0]
    series = {"flashlite (cuda)": ("dispatch_tflops", "#d62728"), "SDPA flash": ("sdpa_flash_tflops", "#1f77b4"),
              "SDPA cuDNN": ("sdpa_cudnn_tflops", "#7f7f7f")}
    xs = [r["seq"] for r in rows]
    ys = [r[k] for r in rows for k, _ in series.values() if r.get(k)]
    el, px, py, (_, _, _, y1) = axes(xs, ys, "sequence length (batch*seq = 16384, heads*head_dim = 2048)", "TFLOP/s")
    for v in range(0, int(y1) + 1, 100):
        el.append(f'<text x="{L - 5}" y="{py(v) + 4}" text-anchor="end">{v}</text>')
        el.append(f'<line x1="{L}" y1="{py(v)}" x2="{W - R}" y2="{py(v)}" stroke="#eee"/>')
    for x in xs:
        el.append(f'<text x="{px(x)}" y="{H - B + 14}" text-anchor="middle">{x}</text>')
    for i, (name, (key, color)) in enumerate(series.items()):
        pts = [(px(r["seq"]), py(r[key])) for r in rows if r.get(key)]
        el.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>')
        el += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>' for a, b in pts]
        el.append(f'<text x="{L + 10}" y="{T + 14 + 14 * i}" fill="{color}">{name}</text>')
    mask = "causal" if causal else "non-causal"
    open(path, "w").write(svg(el, f"Fused forward, bf16, head_dim {d}, {mask} ({data['device']})"))


def roofline(data, path, sbs=None):
    peak = data["ceilings"]["bf16_matmul_tflops"]
    bw = data["ceilings"]["copy_tbps_read_plus_write"]
    pts = []
    fused = data["summary"]
    if sbs:  # the side-by-side run's dispatched kernel (the newer measurement) replaces the sweep's
        fused = [{"seq": r["seq"], "head_dim": r["head_dim"], "causal": r["causal"], "window_left": -1,
                  "dispatch_tflops": r["flashlite"]["tflops"]} for r in sbs["rows"]]
    for r in fused:
        if r["window_left"] >= 0 or not r.get("dispatch_tflops"):
            continue
        # minimal bytes: q, k, v read once, out written once (bf16), lse (fp32); FLOPs as in the table
        tokens, hd = 16384, 2048
        byts = 4 * tokens * hd * 2 + tokens * (hd // r["head_dim"]) * 4
        flops = 4 * tokens * hd * r["seq"] * (0.5 if r["causal"] else 1.0)
        pts.append((flops / byts, r["dispatch_tflops"], r["head_dim"], r["causal"]))
    naive = [p for p in data["peers"] if p["peer"] == "torch_naive"]
    for p in naive:  # textbook three steps: S and P written and read once each in fp32 (16 S^2 bytes per head)
        b, h, s, d = p["batch"], p["heads"], p["seq"], p["head_dim"]
        byts = b * h * (16 * s * s + 8 * s * d)
        pts.append((4 * b * h * s * s * d * 0.5 / byts, p["tflops"], d, "naive"))
    xs = [0.5, 4096]
    el, px, py, _ = axes(xs, [1, peak * 1.3], "arithmetic intensity (FLOP / byte of DRAM traffic, minimal)", "TFLOP/s",
                         xlog=True, ylog=True)
    ridge = peak / bw
    el.append(f'<polyline fill="none" stroke="black" stroke-width="1.5" points="{px(xs[0])},{py(xs[0] * bw)} '
              f'{px(ridge)},{py(peak)} {px(xs[1])},{py(peak)}"/>')
    el.append(f'<text x="{px(ridge) + 6}" y="{py(peak) - 6}">{peak:.0f} TFLOP/s (bf16 matmul), {bw:.2f} TB/s copy</text>')
    for v in (1, 10, 100, 1000):
        el.append(f'<text x="{L - 5}" y="{py(v) + 4}" text-anchor="end">{v}</text>')
    for v in (1, 10, 100, 1000):
        el.append(f'<text x="{px(v)}" y="{H - B + 14}" text-anchor="middle">{v}</text>')
    colors = {64: "#1f77b4", 128: "#d62728"}
    for ai, tf, d, kind in pts:
        c = "#2ca02c" if kind == "naive" else colors.get(d, "black")
        shape = (f'<rect x="{px(ai) - 3}" y="{py(tf) - 3}" width="6" height="6" fill="{c}"/>' if kind is True
                 else f'<circle cx="{px(ai)}" cy="{py(tf)}" r="3.5" fill="{c}"/>')
        el.append(shape)
    el += [f'<text x="{L + 10}" y="{T + 14}" fill="#1f77b4">fused, D64 (circle: full, square: causal)</text>',
           f'<text x="{L + 10}" y="{T + 28}" fill="#d62728">fused, D128</text>',
           f'<text x="{L + 10}" y="{T + 42}" fill="#2ca02c">naive torch (S = 4096, D = 64, causal)</text>']
    open(path, "w").write(svg(el, f"Roofline, {data['device']}"))


def main():
    data = json.load(open(sys.argv[1]))
    out = sys.argv[2].rstrip("/")
    sbs = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
    for d in (64, 128):
        for causal in (False, True):
            tflops_plot(data, d, causal, f"{out}/fwd_d{d}_{'causal' if causal else 'full'}.svg", sbs)
    roofline(data, f"{out}/fwd_roofline.svg", sbs)


if __name__ == "__main__":
    main()
