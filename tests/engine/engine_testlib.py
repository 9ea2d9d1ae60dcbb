"""Helpers for the engine's pytest files (imported by name, so kept out of conftest.py)."""
import json
import pathlib
import shutil
import struct
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_cli(binary, args, stdin=None, check=True):
    """Runs the CLI; returns the CompletedProcess (bytes in, bytes out)."""
    proc = subprocess.run([binary, *args], input=stdin, capture_output=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"flashlite {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    return proc


def model_absent(message):
    """Ends a test whose model files are absent: a skip, or a failure where FLASHLITE_REQUIRE_MODELS=1 (CI)."""
    import os
    import pytest
    if os.environ.get("FLASHLITE_REQUIRE_MODELS") == "1":
        pytest.fail(f"{message} (FLASHLITE_REQUIRE_MODELS=1)")
    pytest.skip(message)


def write_safetensors(path, tensors):
    """name -> numpy array, written as an F32 safetensors file (by hand: the format is a JSON header and raw bytes)."""
    import numpy as np
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_tiny_llama3(directory, tokenizer_json, rope_scaling=False, dim=32, heads=4, kv=2):
    """A tiny random Llama checkpoint (2 layers, dim 32 in 4 heads by default, seed 0) with the real Llama 3
    vocabulary: F32 safetensors, config.json (with Llama 3's RoPE scaling when rope_scaling), and tokenizer.json copied
    beside. Returns directory."""
    import numpy as np
    directory = pathlib.Path(directory)
    rng = np.random.default_rng(0)
    hidden, layers, vocab = 2 * dim, 2, 128256
    hd = dim // heads
    t = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, dim)), "model.norm.weight": np.ones(dim)}
    shapes = {"self_attn.q_proj": (heads * hd, dim), "self_attn.k_proj": (kv * hd, dim),
              "self_attn.v_proj": (kv * hd, dim), "self_attn.o_proj": (dim, heads * hd), "mlp.gate_proj": (hidden, dim),
              "mlp.up_proj": (hidden, dim), "mlp.down_proj": (dim, hidden)}
    for i in range(layers):
        t[f"model.layers.{i}.input_layernorm.weight"] = np.ones(dim)
        t[f"model.layers.{i}.post_attention_layernorm.weight"] = np.ones(dim)
        for name, shape in shapes.items():
            t[f"model.layers.{i}.{name}.weight"] = rng.normal(0, 0.2, shape)
    write_safetensors(directory / "model.safetensors", t)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim, "intermediate_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
           "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}
    if rope_scaling:
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}
    (directory / "config.json").write_text(json.dumps(cfg))
    shutil.copy(tokenizer_json, directory / "tokenizer.json")
    return directory
