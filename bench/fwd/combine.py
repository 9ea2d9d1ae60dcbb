"""Merges the sweep (fwd_sweep.cu) and peer (sdpa_peers.py) JSON of one device run into bench/results/<gpu>/fwd_sweep.json
and prints the side-by-side table (dispatched kernel vs best variant vs torch SDPA flash / cuDNN)."""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("peers")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sweep = json.load(open(a.sweep))
    peers = json.load(open(a.peers))
    table = []
    keys = sorted({(r["head_dim"], r["causal"], r["window_left"], r["sink_tokens"], r["seq"]) for r in sweep["results"]})
    for d, causal, wl, sinks, seq in keys:
        rows = [r for r in sweep["results"] if (r["head_dim"], r["causal"], r["window_left"], r["sink_tokens"], r["seq"]) == (d, causal, wl, sinks, seq)]
        disp = next((r for r in rows if r["label"] == "dispatch"), None)
        var = [r for r in rows if r["label"] != "dispatch" and r["checked"] and r["tflops"] > 0]
        best = max(var, key=lambda r: r["tflops"]) if var else None

        def peer(name):
            for p in peers["rows"]:
                if p["peer"] == name and p["seq"] == seq and p["head_dim"] == d and p["causal"] == causal and \
                        p.get("window_left", -1) == wl and p.get("sink_tokens", 0) == sinks:
                    return p["tflops"]
            return None

        flash, cudnn, flex = peer("sdpa_flash"), peer("sdpa_cudnn"), peer("flex")
        t = {"seq": seq, "head_dim": d, "causal": causal, "window_left": wl, "sink_tokens": sinks,
             "dispatch_kernel": disp and disp["kernel"], "dispatch_tflops": disp and disp["tflops"],
             "best_variant": best and best["label"], "best_variant_tflops": best and best["tflops"],
             "sdpa_flash_tflops": flash, "sdpa_cudnn_tflops": cudnn, "flex_tflops": flex}
        if disp and flash:
            t["ratio_vs_flash"] = round(disp["tflops"] / flash, 3)
        if disp and cudnn:
            t["ratio_vs_cudnn"] = round(disp["tflops"] / cudnn, 3)
        if disp and flex:
            t["ratio_vs_flex"] = round(disp["tflops"] / flex, 3)
        table.append(t)
    merged = {"device": sweep["device"], "commit": sweep["commit"], "torch": peers.get("torch"), "cuda": peers.get("cuda"),
              "ceilings": peers.get("ceilings"), "protocol": sweep["protocol"], "summary": table,
              "variants": sweep["variants"], "results": sweep["results"], "peers": peers["rows"]}
    json.dump(merged, open(a.out, "w"), indent=1)
    print(f"{'D':>4} {'mask':>12} {'seq':>6} {'ours':>7} {'best v':>12} {'flash':>7} {'cudnn':>7} {'x flash':>8} {'x cudnn':>8}")
    for t in table:
        mask = "causal" if t["causal"] else "full"
        if t["window_left"] >= 0:
            mask = f"win{t['window_left']}+{t['sink_tokens']}s"
        f = lambda x: f"{x:7.1f}" if isinstance(x, (int, float)) else "      -"
        print(f"{t['head_dim']:>4} {mask:>12} {t['seq']:>6} {f(t['dispatch_tflops'])} "
              f"{(t['best_variant'] or '-'):>5}{f(t['best_variant_tflops'])} {f(t['sdpa_flash_tflops'] or t['flex_tflops'])} "
              f"{f(t['sdpa_cudnn_tflops'])} {t.get('ratio_vs_flash', t.get('ratio_vs_flex', '-')):>8} {t.get('ratio_vs_cudnn', '-'):>8}")


if __name__ == "__main__":
    main()
