#!/usr/bin/env python3
"""The seeds' micro-pipeline (seed 003, task 6) on the GPU machine: a dummy decoder LLM prefills a 1024-token prompt,
then decodes 100 tokens through a KV cache; TTFT (the prefill, up to the first token's logits) and time between
tokens for two attention implementations inside the same model:

  naive      torch matmul -> masked fp32 softmax -> matmul (grouped K/V repeated per query head)
  flashlite  flashlite.attention: the fused forward for the prefill, and for each decode step one query against the
             cache prefix (bottom-right causal = the whole prefix)

plus a third row, flashlite without a cache (every step re-runs the whole sequence): what the cache saves.

The dummy model: Llama-3.2-1B attention shape (hidden 2048, 32 query heads, 8 KV heads, head_dim 64), --layers
layers of (RMSNorm, QKV projection, attention, output projection, residual), a 2048 -> 8192 vocabulary head, random
bf16 weights, no RoPE/MLP (they cost the same for both implementations). The KV cache is preallocated
(batch, max_len, kv_heads, head_dim) per layer; each step writes one slot. Greedy tokens of both implementations are
compared (they agree unless a near-tie flips one), and the first token's logits difference is reported.

  PYTHONPATH=<flashlite install> python3 bench/pipeline.py --out bench/results/h100/pipeline.json
"""
import argparse
import json
import pathlib
import time

import torch

import flashlite
import flashlite.torch  # noqa: F401  (registers the custom op)

HIDDEN, HQ, HKV, D, VOCAB = 2048, 32, 8, 64, 8192


def naive_attention(q, k, v, causal):
    """q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D] -> [B, Sq, Hq, D]; explicit S = QK^T, bottom-right causal mask."""
    rep = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)                                          # (B, Hq, Sq, D)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)            # (B, Hq, Sk, D)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)).float() * D ** -0.5  # (B, Hq, Sq, Sk)
    sq, sk = q.shape[1], k.shape[1]
    if causal and sq > 1:
        i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > i, float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.matmul(p, vh).transpose(1, 2)


def flashlite_attention(q, k, v, causal):
    return flashlite.attention(q, k, v, causal=causal)


class DummyLLM(torch.nn.Module):
    def __init__(self, layers, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = lambda *s: (torch.randn(*s, generator=g) * s[-1] ** -0.5).to(torch.bfloat16)  # noqa: E731
        self.embed = torch.nn.Parameter(w(VOCAB, HIDDEN) * HIDDEN ** 0.5 * 0.1)
        self.qkv = torch.nn.ParameterList([w((HQ + 2 * HKV) * D, HIDDEN) for _ in range(layers)])
        self.o = torch.nn.ParameterList([w(HIDDEN, HQ * D) for _ in range(layers)])
        self.head = torch.nn.Parameter(w(VOCAB, HIDDEN))

    def new_cache(self, batch, max_len):
        shape = (len(self.qkv), batch, max_len, HKV, D)  # (layers, batch, max_len, kv_heads, head_dim)
        return torch.empty(shape, dtype=torch.bfloat16, device="cuda"), torch.empty(shape, dtype=torch.bfloat16,
                                                                                     device="cuda")

    def forward(self, tokens, attn, cache=None, start=0):
        """tokens [B, S] at positions start..start+S-1; with a cache, K/V go to its slots and attention reads the
        prefix [0, start+S); without one, the tokens are the whole sequence. Returns the last position's logits."""
        b, s = tokens.shape
        x = self.embed[tokens]                                     # (B, S, hidden)
        for layer, (wqkv, wo) in enumerate(zip(self.qkv, self.o)):
            h = torch.nn.functional.rms_norm(x, (HIDDEN,))
            qkv = (h @ wqkv.t()).view(b, s, HQ + 2 * HKV, D)
            q, k, v = qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]
            if cache is not None:
                kc, vc = cache[0][layer], cache[1][layer]
                kc[:, start:start + s], vc[:, start:start + s] = k, v
                k, v = kc[:, :start + s], vc[:, :start + s]
            o = attn(q, k, v, causal=True)                        # (B, S, Hq, D)
            x = x + o.reshape(b, s, HQ * D) @ wo.t()
        return torch.nn.functional.rms_norm(x[:, -1], (HIDDEN,)) @ self.head.t()  # (B, vocab)


@torch.no_grad()
def generate(model, attn, prompt, new, use_cache):
    """Greedy: returns (tokens [B, new], seconds to the first token, seconds per later token, first logits)."""
    batch = prompt.shape[0]
    cache = model.new_cache(batch, prompt.shape[1] + new) if use_cache else None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    logits = model(prompt, attn, cache, 0)
    tok = logits.argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    ttft = time.perf_counter() - t0
    first = logits.float()
    out, seq = [tok], prompt
    t1 = time.perf_counter()
    for i in range(new - 1):
        if use_cache:
            logits = model(tok, attn, cache, prompt.shape[1] + i)
        else:
            seq = torch.cat([seq, tok], dim=1)
            logits = model(seq, attn)
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
    torch.cuda.synchronize()
    tbt = (time.perf_counter() - t1) / (new - 1)
    return torch.cat(out, dim=1), ttft, tbt, first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/h100/pipeline.json")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    model = DummyLLM(args.layers, seed=0).cuda()
    variants = [("naive", naive_attention, True), ("flashlite", flashlite_attention, True),
                ("flashlite_no_cache", flashlite_attention, False)]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "flashlite": flashlite.__version__,
              "model": f"dummy decoder: {args.layers} layers, hidden {HIDDEN}, {HQ} q heads, {HKV} kv heads, "
                       f"head_dim {D}, vocab {VOCAB}, bf16", "prompt": args.prompt, "new_tokens": args.new,
              "runs": []}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for batch in (int(b) for b in args.batches.split(",")):
        g = torch.Generator().manual_seed(batch)
        prompt = torch.randint(0, VOCAB, (batch, args.prompt), generator=g).cuda()
        tokens = {}
        for name, attn, use_cache in variants:
            generate(model, attn, prompt[:, :64], 4, use_cache)  # warm-up
            torch.cuda.reset_peak_memory_stats()
            runs = [generate(model, attn, prompt, args.new, use_cache) for _ in range(args.repeats)]
            ttft = sorted(r[1] for r in runs)[args.repeats // 2]
            tbt = sorted(r[2] for r in runs)[args.repeats // 2]
            tokens[name] = (runs[0][0], runs[0][3])
            row = {"attention": name, "kv_cache": use_cache, "batch": batch, "ttft_ms": ttft * 1e3,
                   "tbt_ms": tbt * 1e3, "decode_tok_s": batch / tbt,
                   "peak_device_bytes": torch.cuda.max_memory_allocated()}
            if name != "naive":
                ref_tok, ref_logits = tokens["naive"]
                row["tokens_equal_naive"] = (runs[0][0] == ref_tok).float().mean().item()
                row["first_logits_max_abs_vs_naive"] = (runs[0][3] - ref_logits).abs().max().item()
            print(json.dumps(row), flush=True)
            result["runs"].append(row)
            out.write_text(json.dumps(result, indent=1) + "\n")  # after every row: a cut-off run keeps its rows


if __name__ == "__main__":
    main()
