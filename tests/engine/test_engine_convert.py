"""scripts/hf_convert_llama2c.py: stories260K converted to Hugging Face form (q/k rows permuted from interleaved to
half-split RoPE) must generate exactly what the llama2.c file does, and its tokenizer.json must encode like tok512.bin
both in the engine and in Hugging Face `tokenizers`."""
import json
import subprocess
import sys

import pytest

from engine_testlib import REPO, model_absent, run_cli
from test_engine_tokenizers import CASES, engine_encode


@pytest.fixture(scope="module")
def converted(models_dir, tmp_path_factory):
    m, t = models_dir / "stories260K" / "stories260K.bin", models_dir / "stories260K" / "tok512.bin"
    if not m.exists() or not t.exists():
        model_absent(f"stories260K absent at {m}")
    out = tmp_path_factory.mktemp("stories260K_hf")
    subprocess.run([sys.executable, str(REPO / "scripts" / "hf_convert_llama2c.py"), str(m), str(t), str(out)], check=True,
                   capture_output=True)
    return m, t, out


@pytest.mark.parametrize("prompt", ["Once upon a time", "The little bird", "Tom and Sue"])
def test_converted_model_generates_the_same(flashlite_bin, converted, prompt):
    m, t, hf = converted
    common = ["--prompt", prompt, "--max-tokens", "200", "--json"]
    a = json.loads(run_cli(flashlite_bin, ["generate", "--model", str(m), "--tokenizer", str(t)] + common).stdout)
    b = json.loads(run_cli(flashlite_bin, ["generate", "--model", str(hf)] + common).stdout)
    assert a["outputs"][0]["prompt_ids"] == b["outputs"][0]["prompt_ids"]
    assert a["outputs"][0]["ids"] == b["outputs"][0]["ids"]
    assert len(a["outputs"][0]["ids"]) > 20


def test_converted_tokenizer_matches(flashlite_bin, converted):
    tokenizers = pytest.importorskip("tokenizers")
    _, t, hf_dir = converted
    texts = [s for s in CASES if "\u2581" not in s]
    want = [g["ids"] for g in engine_encode(flashlite_bin, t, texts, False)]
    got = [g["ids"] for g in engine_encode(flashlite_bin, hf_dir, texts, False)]
    assert got == want
    hf = tokenizers.Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    hf_ids = [hf.encode(s, add_special_tokens=False).ids for s in texts]
    bad = [(s, w, h) for s, w, h in zip(texts, want, hf_ids) if w != h]
    assert not bad, f"{len(bad)} differ, e.g. {bad[:3]}"


def test_converted_model_scores_the_same(flashlite_bin, converted, tmp_path):
    """Teacher-forced logits of every position (flashlite score): the llama2.c file, its HF conversion, and the HF
    conversion fed one token at a time after position 4 all agree."""
    np = pytest.importorskip("numpy")
    m, t, hf = converted
    text = "Once upon a time, there was a little girl named Lily. She loved to play."
    run_cli(flashlite_bin, ["score", "--model", str(m), "--tokenizer", str(t), "--text", text, "--out", str(tmp_path / "a.npy")])
    run_cli(flashlite_bin, ["score", "--model", str(hf), "--text", text, "--out", str(tmp_path / "b.npy")])
    run_cli(flashlite_bin, ["score", "--model", str(hf), "--text", text, "--decode-from", "4", "--out", str(tmp_path / "c.npy")])
    a, b, c = (np.load(tmp_path / f"{n}.npy") for n in "abc")
    assert a.shape == b.shape == c.shape and a.shape[1] == 512 and a.shape[0] > 15
    assert np.isfinite(a).all()
    assert np.abs(a - b).max() < 1e-4
    assert np.abs(b - c).max() < 1e-4
