"""`flashlite generate | chat` end to end on the CPU: the real llama2.c models, a tiny random Hugging Face checkpoint
written here (numpy + our own safetensors writer) with the real Llama 3 tokenizer beside it (chat template, KV cache
kept between turns), the JSON report, and clear errors."""
import json
import shutil
import struct

import numpy as np
import pytest

from engine_testlib import run_cli


def stories(models_dir):
    m, t = models_dir / "stories260K" / "stories260K.bin", models_dir / "stories260K" / "tok512.bin"
    if not m.exists() or not t.exists():
        pytest.skip(f"stories260K absent at {m}")
    return str(m), str(t)


def test_generate_json_greedy(flashlite_bin, models_dir):
    m, t = stories(models_dir)
    args = ["generate", "--model", m, "--tokenizer", t, "--prompt", "Once upon a time", "--max-tokens", "60", "--json"]
    out = json.loads(run_cli(flashlite_bin, args).stdout)
    o = out["outputs"][0]
    assert len(o["ids"]) > 10 and o["text"].strip(), o
    assert all(c.isprintable() or c == "\n" for c in o["text"]), o["text"]
    for key in ("ttft_ms", "mean_tbt_ms", "median_tbt_ms", "decode_tokens_per_s", "peak_rss_bytes", "prefill_tokens_per_s"):
        assert out["stats"][key] > 0, key
    again = json.loads(run_cli(flashlite_bin, args).stdout)["outputs"][0]
    assert again["ids"] == o["ids"], "greedy generation must be deterministic"


def test_generate_continuation_text_agrees_with_the_stream(flashlite_bin, models_dir):
    # The streamed text (prompt, then each piece as it comes), the JSON report's prompt + text and the batch lines must
    # be the same string: a continuation keeps the leading space of its first piece ("the park" + " with"); only the
    # sequence's very first piece loses SentencePiece's dummy-prefix space.
    m, t = stories(models_dir)
    prompts = ["Lily went to the park", "a", "Once upon a time"]
    base = ["generate", "--model", m, "--tokenizer", t, "--max-tokens", "12"]
    streamed = [run_cli(flashlite_bin, base + ["--prompt", p]).stdout.decode() for p in prompts]
    assert any(s[len(p)] == " " for s, p in zip(streamed, prompts)), streamed  # the case this test is about
    batch_args = base + [a for p in prompts for a in ("--prompt", p)]
    report = json.loads(run_cli(flashlite_bin, batch_args + ["--json"]).stdout)["outputs"]
    for i, s in enumerate(streamed):
        assert report[i]["prompt"] + report[i]["text"] == s, (report[i], s)
    printed = run_cli(flashlite_bin, batch_args).stdout.decode()
    assert printed == "".join(f"[{i}] {s}\n" for i, s in enumerate(streamed)), printed


def test_generate_streams_text_and_stats(flashlite_bin, models_dir):
    m, t = stories(models_dir)
    proc = run_cli(flashlite_bin, ["generate", "--model", m, "--tokenizer", t, "--prompt", "The dog", "--max-tokens", "30"])
    assert proc.stdout.decode().startswith("The dog") and len(proc.stdout) > 20
    err = proc.stderr.decode()
    assert "TTFT" in err and "time between tokens" in err and "tok/s" in err and "peak memory" in err, err


def test_generate_batch_matches_single(flashlite_bin, models_dir):
    m, t = stories(models_dir)
    base = ["generate", "--model", m, "--tokenizer", t, "--max-tokens", "25", "--json"]
    prompts = ["Once upon a time", "Tom had a big red ball and he"]
    batch = json.loads(run_cli(flashlite_bin, base + sum((["--prompt", p] for p in prompts), [])).stdout)["outputs"]
    for p, b in zip(prompts, batch):
        single = json.loads(run_cli(flashlite_bin, base + ["--prompt", p]).stdout)["outputs"][0]
        assert single["ids"] == b["ids"], p


def test_generate_sampling_seeded(flashlite_bin, models_dir):
    m, t = stories(models_dir)
    base = ["generate", "--model", m, "--tokenizer", t, "--prompt", "Lily", "--max-tokens", "30", "--json",
            "--temperature", "0.9", "--top-k", "40", "--top-p", "0.95"]
    a = json.loads(run_cli(flashlite_bin, base + ["--seed", "1"]).stdout)["outputs"][0]["ids"]
    b = json.loads(run_cli(flashlite_bin, base + ["--seed", "1"]).stdout)["outputs"][0]["ids"]
    c = json.loads(run_cli(flashlite_bin, base + ["--seed", "2"]).stdout)["outputs"][0]["ids"]
    assert a == b and a != c


def test_generate_errors(flashlite_bin, models_dir, tmp_path):
    m, t = stories(models_dir)
    proc = run_cli(flashlite_bin, ["generate", "--model", m, "--prompt", "x"], check=False)
    assert proc.returncode != 0 and b"--tokenizer" in proc.stderr, proc.stderr
    long_prompt = "the cat sat on the mat " * 200
    proc = run_cli(flashlite_bin, ["generate", "--model", m, "--tokenizer", t, "--prompt", long_prompt], check=False)
    assert proc.returncode != 0 and b"context holds 512" in proc.stderr, proc.stderr
    trunc = tmp_path / "trunc.bin"
    trunc.write_bytes(open(m, "rb").read()[:5000])
    proc = run_cli(flashlite_bin, ["generate", "--model", str(trunc), "--tokenizer", t], check=False)
    assert proc.returncode != 0 and b"truncated" in proc.stderr, proc.stderr
    proc = run_cli(flashlite_bin, ["generate", "--model", str(tmp_path), "--prompt", "x"], check=False)
    assert proc.returncode != 0 and b"config.json" in proc.stderr, proc.stderr
    proc = run_cli(flashlite_bin, ["generate", "--model", m, "--tokenizer", t, "--prompt", "", "--no-bos"], check=False)
    assert proc.returncode != 0 and b"prompt is empty" in proc.stderr and b"--no-bos" in proc.stderr, proc.stderr


def test_chat_llama2c_continuation(flashlite_bin, models_dir):
    m, t = stories(models_dir)
    proc = run_cli(flashlite_bin, ["chat", "--model", m, "--tokenizer", t, "--max-tokens", "20"],
                   stdin=b"Once upon a time\nThen the dog\n")
    err = proc.stderr.decode()
    assert "plain continuation" in err and err.count("cached]") == 2, err
    assert len(proc.stdout.decode().strip().splitlines()) >= 2


def cached_counts(stderr):
    return [int(line.split(",")[-1].split()[0]) for line in stderr.splitlines() if line.endswith("cached]")]


def assert_failed_turn_leaves_no_trace(flashlite_bin, args, lines, failing):
    """A chat whose `failing` line is rejected (too long for the context) must continue exactly as the same chat
    without that line: same replies, same cache (BOS and system prompt included when it was the first turn)."""
    def chat(ls):
        return run_cli(flashlite_bin, ["chat", *args], stdin="".join(x + "\n" for x in ls).encode())
    with_fail = chat(lines[:failing] + ["the cat sat on the mat " * 40] + lines[failing:])
    plain = chat(lines)
    err = with_fail.stderr.decode()
    assert "context holds 64" in err, err
    assert with_fail.stdout == plain.stdout, (with_fail.stdout, plain.stdout)
    assert cached_counts(err) == cached_counts(plain.stderr.decode()), (err, plain.stderr.decode())


@pytest.mark.parametrize("failing", [0, 1])
def test_chat_failed_turn_keeps_the_conversation(flashlite_bin, models_dir, failing):
    m, t = stories(models_dir)
    assert_failed_turn_leaves_no_trace(flashlite_bin, ["--model", m, "--tokenizer", t, "--context", "64", "--max-tokens", "6"],
                                       ["Once upon a time", "Then the dog"], failing)


# ---- A tiny random Llama checkpoint with the real Llama 3 vocabulary ----

def write_safetensors(path, tensors):
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


@pytest.fixture(scope="module")
def tiny_llama3(models_dir, tmp_path_factory):
    tok = models_dir / "llama3-tokenizer"
    if not (tok / "tokenizer.json").exists():
        pytest.skip("Llama 3 tokenizer absent")
    d = tmp_path_factory.mktemp("tiny_llama3")
    rng = np.random.default_rng(0)
    dim, hidden, layers, heads, kv, vocab = 32, 64, 2, 4, 2, 128256
    hd = dim // heads
    t = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, dim)), "model.norm.weight": np.ones(dim)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(dim)
        t[p + "post_attention_layernorm.weight"] = np.ones(dim)
        t[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.2, (heads * hd, dim))
        t[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.2, (kv * hd, dim))
        t[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.2, (kv * hd, dim))
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (dim, heads * hd))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.2, (hidden, dim))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.2, (hidden, dim))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.2, (dim, hidden))
    write_safetensors(d / "model.safetensors", t)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim, "intermediate_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
           "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(tok / "tokenizer.json", d / "tokenizer.json")
    return d


def test_chat_llama3_template_keeps_cache(flashlite_bin, tiny_llama3):
    proc = run_cli(flashlite_bin, ["chat", "--model", str(tiny_llama3), "--max-tokens", "8", "--system", "Be brief."],
                   stdin=b"Hello there!\nAnd again?\n/reset\nFresh start\n")
    err = proc.stderr.decode()
    assert "Llama 3 chat template" in err, err
    cached = [int(line.split(",")[-1].split()[0]) for line in err.splitlines() if line.endswith("cached]")]
    assert len(cached) == 3, err
    # Turn 2 builds on turn 1's cache; /reset starts over, so turn 3 holds less than turn 2.
    assert cached[1] > cached[0] + 10 and cached[2] < cached[1], cached


def test_generate_hf_dir_with_llama3_tokenizer(flashlite_bin, tiny_llama3):
    out = json.loads(run_cli(flashlite_bin, ["generate", "--model", str(tiny_llama3), "--prompt", "Hi", "--max-tokens", "5",
                                             "--json"]).stdout)
    o = out["outputs"][0]
    assert o["prompt_ids"][0] == 128000 and len(o["ids"]) <= 5


@pytest.mark.parametrize("failing", [0, 1])
def test_chat_llama3_failed_turn_keeps_bos_and_system(flashlite_bin, tiny_llama3, failing):
    assert_failed_turn_leaves_no_trace(flashlite_bin, ["--model", str(tiny_llama3), "--context", "64", "--max-tokens", "4",
                                                       "--system", "Be brief."], ["Hi", "Again"], failing)
