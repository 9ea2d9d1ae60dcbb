"""`flashlite serve --device cuda` (skips without the engine's CUDA path): a request alone gives `flashlite generate
--device cuda`'s greedy text, and 64 concurrent requests give each its answer alone, or a tie-aware agreement: the
first token where they differ is one where the alone run's two best candidates are within bf16 noise of each other."""
import concurrent.futures
import json
import subprocess

import openai
import pytest

from test_serve import PROMPTS, client, stories

TIE_LOGPROB = 0.05  # two candidates closer than this are a tie in bf16 (the engine's parity tests use the same idea)


@pytest.fixture(scope="module")
def cuda_server(flashlite_bin, models_dir):
    probe = subprocess.run([flashlite_bin, "generate", "--model", stories(models_dir), "--device", "cuda", "--max-tokens",
                            "1", "--json"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the engine's CUDA path is unavailable: {probe.stderr[-300:]}")
    from serve_testlib import Server
    s = Server(flashlite_bin, ["--model", stories(models_dir), "--device", "cuda", "--max-batch", "64"])
    yield s
    s.stop()


def test_cuda_request_alone_equals_generate(cuda_server, flashlite_bin, models_dir):
    for p in PROMPTS[:3]:
        out = subprocess.run([flashlite_bin, "generate", "--model", stories(models_dir), "--device", "cuda", "--prompt", p,
                              "--max-tokens", "60", "--json"], capture_output=True, text=True, check=True)
        want = json.loads(out.stdout)["outputs"][0]["text"]
        got = client(cuda_server).completions.create(model="stories260K", prompt=p, max_tokens=60, temperature=0)
        assert got.choices[0].text == want, p


def agree(alone, together):
    """Same tokens, or the same up to a first difference where `alone` had a near tie."""
    a, b = alone.tokens, together.tokens
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            top = sorted(alone.top_logprobs[i].values(), reverse=True)
            return len(top) > 1 and top[0] - top[1] < TIE_LOGPROB
    return len(a) == len(b)


def test_cuda_64_concurrent_requests_agree_with_their_answers_alone(cuda_server):
    c = client(cuda_server, timeout=300)
    jobs = [dict(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8 + (i * 11) % 90) for i in range(64)]

    def run(job):
        r = c.completions.create(model="stories260K", temperature=0, logprobs=2, extra_body={"ignore_eos": True}, **job)
        return r.choices[0].logprobs

    alone = [run(job) for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        together = list(pool.map(run, jobs))
    disagree = [j for j, a, t in zip(jobs, alone, together) if not agree(a, t)]
    assert not disagree, disagree
    m = cuda_server.wait_idle()
    assert m["flashlite_kv_pages_used"] == 0 and m["flashlite_requests_failed_total"] == 0
