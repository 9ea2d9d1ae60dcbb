"""Decode plot (plain SVG, no plotting library): % of the measured read bandwidth per shape, replayed from a CUDA
graph, for flashlite's split-KV kernel (contiguous and paged-16 caches) and torch SDPA's backends on the same shapes
(Hq 32, Hkv 8, D 128, bf16, q_len 1). Eager numbers are in the JSON; the graph column is what a decode loop sees.

    python3 bench/decode/plots.py bench/results/h100/decode.json bench/results/h100/sdpa_decode.json \
        bench/results/h100/decode_bandwidth.svg
"""
import json
import sys

W, H, L, R, T, B = 720, 380, 60, 20, 40, 70
COLORS = {"flashlite": "#1f77b4", "flashlite paged 16": "#6baed6", "sdpa_cudnn": "#d62728",
          "sdpa_flash": "#ff7f0e", "sdpa_efficient": "#2ca02c"}


def main(decode_path, sdpa_path, out_path):
    dec, sdpa = json.load(open(decode_path)), json.load(open(sdpa_path))
    bw = dec["read_bw_tbps"]
    dec["rows"] = [r for r in dec["rows"] if r.get("kind", "main") == "main"]  # (--quick adds recompute rows)
    shapes = sorted({(r["batch"], r["kv_len"]) for r in dec["rows"] if r["layout"] == "contiguous"})
    series = {name: {} for name in COLORS}
    for r in dec["rows"]:
        key = (r["batch"], r["kv_len"])
        if r["layout"] == "contiguous":
            series["flashlite"][key] = r["pct_read_bw_graph"]
        elif r["page_size"] == 16:
            series["flashlite paged 16"][key] = r["pct_read_bw_graph"]
    for r in sdpa["rows"]:
        if r["peer"] in series and r.get("tbps_graph"):
            series[r["peer"]][(r["batch"], r["kv_len"])] = 100 * r["tbps_graph"] / bw
    names = [n for n in COLORS if series[n]]
    group_w = (W - L - R) / len(shapes)
    bar_w = group_w * 0.8 / len(names)
    py = lambda v: H - B - v / 100 * (H - T - B)
    el = [f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
          f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
          f'<text x="14" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 14 {(T + H - B) / 2})">'
          f'% of measured read bandwidth ({bw:.2f} TB/s)</text>']
    for v in range(0, 101, 20):
        el.append(f'<line x1="{L}" y1="{py(v)}" x2="{W - R}" y2="{py(v)}" stroke="#ddd"/>')
        el.append(f'<text x="{L - 6}" y="{py(v) + 4}" text-anchor="end">{v}</text>')
    for i, (b, n) in enumerate(shapes):
        x0 = L + i * group_w + group_w * 0.1
        for j, name in enumerate(names):
            v = series[name].get((b, n))
            if v is None:
                continue
            x = x0 + j * bar_w
            el.append(f'<rect x="{x:.1f}" y="{py(v):.1f}" width="{bar_w - 1:.1f}" height="{H - B - py(v):.1f}" '
                      f'fill="{COLORS[name]}"><title>{name} b{b} kv{n}: {v:.1f}%</title></rect>')
        el.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{H - B + 16}" text-anchor="middle">b{b} kv{n}</text>')
    for j, name in enumerate(names):
        x = L + 10 + j * 130
        el.append(f'<rect x="{x}" y="{H - 30}" width="10" height="10" fill="{COLORS[name]}"/>')
        el.append(f'<text x="{x + 14}" y="{H - 21}">{name}</text>')
    title = f"Decode, {dec['device']}, Hq 32 / Hkv 8 / D 128 bf16, graph replay (flashlite {str(dec.get('commit', ''))[:7]})"
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">'
    svg = "\n".join([head, '<rect width="100%" height="100%" fill="white"/>',
                     f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="13">{title}</text>', *el, "</svg>"])
    open(out_path, "w").write(svg + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
