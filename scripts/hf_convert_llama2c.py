#!/usr/bin/env python3
"""Convert a llama2.c checkpoint (legacy version-0 .bin) and its tokenizer .bin into a Hugging Face Llama directory:
config.json, generation_config.json, model.safetensors (float32) and tokenizer.json (Llama-2 style BPE with byte
fallback). Needs only numpy.

RoPE: llama2.c rotates adjacent pairs (2i, 2i+1) of each head; Hugging Face rotates the halves (i, i + D/2). The same
model in HF form therefore has the rows of wq and wk permuted within each head: HF row i takes llama2.c row 2i and HF
row i + D/2 takes llama2.c row 2i + 1. Queries and keys are permuted alike, so every q.k dot product is unchanged.

Usage: python3 scripts/hf_convert_llama2c.py MODEL.bin TOKENIZER.bin OUT_DIR
"""
import argparse
import json
import pathlib
import struct
import sys

import numpy as np


def read_checkpoint(path):
    raw = pathlib.Path(path).read_bytes()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hd = dim // heads
    floats = np.frombuffer(raw, dtype="<f4", offset=28)
    sizes = [("emb", (vocab, dim)), ("rms_att", (layers, dim)), ("wq", (layers, heads * hd, dim)),
             ("wk", (layers, kv_heads * hd, dim)), ("wv", (layers, kv_heads * hd, dim)), ("wo", (layers, dim, heads * hd)),
             ("rms_ffn", (layers, dim)), ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
             ("w3", (layers, hidden, dim)), ("rms_final", (dim,)), ("freq_real", (seq_len, hd // 2)),
             ("freq_imag", (seq_len, hd // 2))]
    if not shared:
        sizes.append(("wcls", (vocab, dim)))
    need = sum(int(np.prod(s)) for _, s in sizes)
    if floats.size != need:
        sys.exit(f"{path}: {floats.size} floats after the header, expected {need} for this config (not a v0 llama2.c file?)")
    w, off = {}, 0
    for name, shape in sizes:
        n = int(np.prod(shape))
        w[name] = floats[off:off + n].reshape(shape)
        off += n
    cfg = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab, seq_len=seq_len,
               shared=shared)
    return cfg, w


def interleaved_to_half(w, n_heads):
    """(n_heads * D, dim) rows in llama2.c's pair order -> Hugging Face's rotate-half order."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_tokenizer(path, vocab_size):
    raw = pathlib.Path(path).read_bytes()
    off = 4
    pieces, scores = [], []
    while off < len(raw):
        score, n = struct.unpack("<fi", raw[off:off + 8])
        pieces.append(raw[off + 8:off + 8 + n])
        scores.append(score)
        off += 8 + n
    if len(pieces) != vocab_size:
        sys.exit(f"{path}: {len(pieces)} tokens, the model has {vocab_size}")
    return pieces, scores


def tokenizer_json(pieces, scores):
    """Llama-2 style tokenizer.json. Merges are every split of a piece into two vocabulary pieces, ranked by the merged
    piece's score (highest first), which is how SentencePiece's score-greedy BPE is expressed as merge ranks."""
    names = ["<unk>", "<s>", "</s>"]
    vocab = {}
    for i, p in enumerate(pieces):
        tok = names[i] if i < 3 else p.decode("utf-8", errors="surrogateescape").replace(" ", "\u2581")
        if tok in vocab:  # keep the first id; a duplicate piece could never be produced anyway
            tok = f"<dup_{i}>"
        vocab[tok] = i
    merges = []
    for tok, i in vocab.items():
        if i < 3 or tok.startswith("<0x") or len(tok) < 2:
            continue
        for k in range(1, len(tok)):
            a, b = tok[:k], tok[k:]
            if a in vocab and b in vocab:
                merges.append((-scores[i], i, vocab[a], vocab[b], a, b))
    merges.sort()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": names[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i in range(3)],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[m[4], m[5]] for m in merges]},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    args = ap.parse_args()
    cfg, w = read_checkpoint(args.model)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = {"model.embed_tokens.weight": w["emb"], "model.norm.weight": w["rms_final"]}
    for l in range(cfg["layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = w["rms_att"][l]
        t[p + "self_attn.q_proj.weight"] = interleaved_to_half(w["wq"][l], cfg["heads"])
        t[p + "self_attn.k_proj.weight"] = interleaved_to_half(w["wk"][l], cfg["kv_heads"])
        t[p + "self_attn.v_proj.weight"] = w["wv"][l]
        t[p + "self_attn.o_proj.weight"] = w["wo"][l]
        t[p + "post_attention_layernorm.weight"] = w["rms_ffn"][l]
        t[p + "mlp.gate_proj.weight"] = w["w1"][l]
        t[p + "mlp.up_proj.weight"] = w["w3"][l]
        t[p + "mlp.down_proj.weight"] = w["w2"][l]
    if not cfg["shared"]:
        t["lm_head.weight"] = w["wcls"]
    write_safetensors(out / "model.safetensors", t)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg["dim"],
        "intermediate_size": cfg["hidden"], "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"], "head_dim": cfg["dim"] // cfg["heads"], "vocab_size": cfg["vocab"],
        "max_position_embeddings": cfg["seq_len"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": cfg["shared"], "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # llama2.c ends a story when the model emits BOS; keep that as a stop token beside EOS.
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 1]}, indent=2))
    pieces, scores = read_tokenizer(args.tokenizer, cfg["vocab"])
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(pieces, scores), ensure_ascii=False))
    print(f"wrote {out}: {sum(a.size for a in t.values())} parameters, {cfg['layers']} layers, vocab {cfg['vocab']}")


if __name__ == "__main__":
    main()
