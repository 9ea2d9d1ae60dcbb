"""bench/bwd/model_grad_error.py, tiny and on the CPU (the GPU run probes the training runs' models after a
warm-up): every parameter's bf16 gradient through attn_implementation="flite" is as close to the float64 model's as
through transformers' own sdpa and eager attention, and so is the loss."""
import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch,amp", [("llama", False), ("gpt_oss", True)])
def test_whole_model_gradients_are_as_close_to_float64_as_the_references(arch, amp):
    spec = importlib.util.spec_from_file_location("flashlite_bench_model_grad_error",
                                                  ROOT / "bench" / "bwd" / "model_grad_error.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--device", "cpu", "--tiny", "--batch", "2", "--seq", "48", "--batches", "1", "--warm-steps", "2",
                    "--arch", arch] + (["--amp"] if amp else []))
    by = {r["impl"]: r for r in out["rows"]}
    refs = ("sdpa", "eager") if arch == "llama" else ("eager",)  # gpt-oss's sinks: eager alone implements them
    assert set(by) == {"flite", *refs}
    worst_ref = max(by[i]["all"]["rel_err"] for i in refs)
    for group in ("all", "attention", "mlp", "other"):
        ref = max(by[i][group]["rel_err"] for i in refs)
        assert by["flite"][group]["rel_err"] <= 2 * ref + 1e-4, group
        # The direction too, by the same rule (an absolute bound moved with transformers' and torch's versions: the
        # mixed-precision GPT-OSS's 0.99988 failed 0.9999 where eager's was 0.99973), and never far off.
        ref_gap = max(1 - by[i][group]["cos"] for i in refs)
        assert 1 - by["flite"][group]["cos"] <= 2 * ref_gap + 1e-5, group
        assert by["flite"][group]["cos"] > 0.999, group
    assert 0 < worst_ref < 0.05  # bf16 against float64: an error, and a small one
    assert abs(by["flite"]["loss_diff"]) <= 2 * max(abs(by[i]["loss_diff"]) for i in refs) + 1e-3
