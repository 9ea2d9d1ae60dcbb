"""The engine on a CUDA GPU against Hugging Face transformers (runs on the GPU machine; skips without torch,
transformers, a CUDA device or a CUDA build of flashlite).

1. stories260K converted by scripts/hf_convert_llama2c.py: transformers' fp32 greedy continuation and the engine's
   (CUDA, fp32) agree token for token for 200 steps.
2. A LlamaForCausalLM with random weights at the Llama-3.2-1B config, saved with save_pretrained (bf16) beside the real
   Llama 3 tokenizer: teacher-forced per-position logits of the engine (CUDA, bf16) vs transformers (bf16, and an fp32
   upcast as the reference). Reports max abs / relative error; the engine's error against fp32 must be no worse than
   twice transformers' own bf16 error; top-1 vs fp32 no worse than transformers-bf16's own agreement with fp32 minus 3
   points; >= 99% top-1 agreement on decisive positions (fp32 top-1/top-2 margin > 4x the bf16 rounding error); and,
   over all positions, >= 99% of the engine's top-1 picks within bf16 tolerance of fp32's top-1 (the picked token's
   fp32 logit within 4x the position's bf16 rounding error of the maximum: a near-tie broken either way counts).
Set FLASHLITE_PARITY_OUT to a directory to keep a JSON report.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from engine_testlib import REPO, run_cli

torch = pytest.importorskip("torch", reason="torch is needed for the transformers parity tests")
transformers = pytest.importorskip("transformers", reason="transformers is needed for the parity tests")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture(scope="module")
def cuda_bin(flashlite_bin, models_dir):
    m = models_dir / "stories260K" / "stories260K.bin"
    proc = run_cli(flashlite_bin, ["generate", "--model", str(m), "--tokenizer", str(m.parent / "tok512.bin"),
                                   "--device", "cuda", "--max-tokens", "1", "--json"], check=False)
    if proc.returncode != 0:
        pytest.skip(f"the engine's CUDA path is unavailable: {proc.stderr.decode(errors='replace')[-300:]}")
    return flashlite_bin


def report(name, data):
    out = os.environ.get("FLASHLITE_PARITY_OUT")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / f"{name}.json").write_text(json.dumps(data, indent=2))
    print(name, json.dumps(data))


def test_stories260k_greedy_matches_transformers_fp32(cuda_bin, models_dir, tmp_path):
    m, t = models_dir / "stories260K" / "stories260K.bin", models_dir / "stories260K" / "tok512.bin"
    hf_dir = tmp_path / "stories260K_hf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "hf_convert_llama2c.py"), str(m), str(t), str(hf_dir)], check=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).cuda().eval()
    prompt = [1, 403, 407, 261, 378]  # BOS + "Once upon a time"
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        for _ in range(200):  # plain greedy, no stop tokens
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    want = ids[0, len(prompt):].tolist()
    out = json.loads(run_cli(cuda_bin, ["generate", "--model", str(hf_dir), "--device", "cuda", "--precision", "fp32",
                                        "--prompt", "Once upon a time", "--max-tokens", "200", "--ignore-eos",
                                        "--json"]).stdout)["outputs"][0]
    assert out["prompt_ids"] == prompt
    first_diff = next((i for i, (a, b) in enumerate(zip(out["ids"], want)) if a != b), None)
    report("stories260k_greedy", {"steps": 200, "first_difference": first_diff, "match": out["ids"] == want})
    assert out["ids"] == want, f"first difference at step {first_diff}"


LLAMA32_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                  rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
                  eos_token_id=[128001, 128008, 128009],
                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192})


def llama32_1b_random(models_dir, root):
    """The random 1B-shaped checkpoint with the Llama 3 tokenizer files beside it (cached under `root`)."""
    d = pathlib.Path(root) / "llama32_1b_random"
    if (d / "config.json").exists() and (d / "tokenizer.json").exists():
        return d
    tok = models_dir / "llama3-tokenizer"
    if not (tok / "tokenizer.json").exists():
        pytest.skip("Llama 3 tokenizer absent")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**LLAMA32_1B)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, d / f)
    return d


def test_llama32_1b_random_logits_within_bf16_tolerance(cuda_bin, models_dir, tmp_path_factory):
    root = os.environ.get("FLASHLITE_PARITY_CACHE") or tmp_path_factory.mktemp("parity")
    d = llama32_1b_random(models_dir, root)
    rng = np.random.default_rng(1)
    ids = [128000] + rng.integers(0, 128000, 511).tolist()
    model = transformers.LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16).cuda().eval()
    x = torch.tensor([ids], device="cuda")
    with torch.no_grad():
        ref_bf16 = model(x).logits[0].float()
        model = model.float()
        ref_f32 = model(x).logits[0].float()
    del model
    torch.cuda.empty_cache()
    out = tmp_path_factory.mktemp("scores") / "engine.npy"
    info = json.loads(run_cli(cuda_bin, ["score", "--model", str(d), "--device", "cuda", "--ids", ",".join(map(str, ids)),
                                         "--decode-from", "448", "--out", str(out)]).stdout)
    got = torch.from_numpy(np.load(out)).cuda()
    assert torch.isfinite(got).all()
    rel = lambda a, b: float((a - b).norm() / b.norm())
    top1 = lambda a, b, m=slice(None): float((a[m].argmax(-1) == b[m].argmax(-1)).float().mean())
    # Random weights give near-ties: a position is decisive when fp32's top-1/top-2 margin exceeds 4x that position's
    # RMS bf16 rounding error (transformers bf16 vs fp32), so rounding alone can hardly flip its argmax.
    top2 = ref_f32.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    bf16_rms = (ref_bf16 - ref_f32).pow(2).mean(-1).sqrt()
    decisive = margin > 4 * bf16_rms
    # Over all positions, near-ties included: the pick is a top-1 within bf16 tolerance when its fp32 logit is within
    # 4x that position's RMS bf16 rounding error of fp32's maximum (a wrong model picks tokens far below it: among
    # 128k random logits only a handful lie that close to the top).
    def tie_aware(a):
        picked = ref_f32.gather(-1, a.argmax(-1, keepdim=True))[:, 0]
        short = (top2[:, 0] - picked) / bf16_rms
        return float((short <= 4).float().mean()), float(short.max())
    engine_tie, engine_short = tie_aware(got)
    tf_tie, tf_short = tie_aware(ref_bf16)
    data = {
        "positions": len(ids), "attention_kernel": info["attention_kernel"], "device": info["device"],
        "engine_vs_f32": {"max_abs": float((got - ref_f32).abs().max()), "rel": rel(got, ref_f32)},
        "transformers_bf16_vs_f32": {"max_abs": float((ref_bf16 - ref_f32).abs().max()), "rel": rel(ref_bf16, ref_f32)},
        "engine_vs_transformers_bf16": {"max_abs": float((got - ref_bf16).abs().max()), "rel": rel(got, ref_bf16)},
        "top1_agreement_vs_bf16": top1(got, ref_bf16),
        "top1_agreement_vs_f32": top1(got, ref_f32),
        "transformers_bf16_top1_agreement_vs_f32": top1(ref_bf16, ref_f32),  # the floor bf16 itself reaches
        "decisive_positions": int(decisive.sum()),
        "top1_agreement_vs_f32_decisive": top1(got, ref_f32, decisive),
        "transformers_bf16_top1_vs_f32_decisive": top1(ref_bf16, ref_f32, decisive),
        "top1_within_bf16_tolerance_vs_f32": engine_tie,
        "transformers_bf16_top1_within_bf16_tolerance_vs_f32": tf_tie,
        "worst_pick_shortfall_in_bf16_rms": engine_short,
        "transformers_bf16_worst_pick_shortfall_in_bf16_rms": tf_short,
    }
    report("llama32_1b_random_parity", data)
    # The issue's literal ">= 99% top-1 on all positions" is above what transformers' own bf16 reaches against fp32 on
    # these near-tied random logits; these bounds still fail on a real bug (a wrong layer, RoPE or mask moves the
    # error and the agreement far past them).
    assert data["engine_vs_f32"]["rel"] <= 2 * data["transformers_bf16_vs_f32"]["rel"] + 1e-3
    assert data["top1_agreement_vs_f32"] >= data["transformers_bf16_top1_agreement_vs_f32"] - 0.03
    assert data["decisive_positions"] >= len(ids) // 4, "too few decisive positions for the check to mean anything"
    assert data["top1_agreement_vs_f32_decisive"] >= 0.99
    assert data["top1_within_bf16_tolerance_vs_f32"] >= 0.99
