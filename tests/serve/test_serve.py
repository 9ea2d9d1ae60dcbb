"""`flashlite serve` end to end on the CPU with stories260K (and a tiny random Llama with the real Llama 3 tokenizer for
the chat template): the official `openai` client for chat and completions (streaming and not, usage, logprobs, stop
strings, seeds, n choices), greedy text equal to `flashlite generate`, 200 concurrent requests each equal to its
answer alone with every KV page free afterwards, raw HTTP for the errors, cancellation, the queue limit, the API key
and shutdown."""
import concurrent.futures
import json
import re
import signal
import socket
import subprocess
import time

import numpy as np
import openai
import pytest

from serve_testlib import Server

PROMPTS = ["Once upon a time", "Lily went to the park", "The dog", "Tom had a big red ball and he",
           "One day, a little bird", "Sue and her mom"]


def stories(models_dir):
    return str(models_dir / "stories260K" / "stories260K.bin")


def client(server, api_key="unused", timeout=60):
    # No idle keep-alive connections: the server's shutdown waits for those (up to its 5 s keep-alive timeout).
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=timeout,
                         default_headers={"Connection": "close"})


def generate(flashlite_bin, models_dir, prompt, max_tokens, *extra):
    out = subprocess.run([flashlite_bin, "generate", "--model", stories(models_dir), "--prompt", prompt, "--max-tokens",
                          str(max_tokens), "--json", *extra], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)["outputs"][0]


@pytest.fixture(scope="module")
def server(flashlite_bin, models_dir):
    # 96 pages of 16 tokens: fewer than 16 sequences at full context, so admission waits for pages too.
    s = Server(flashlite_bin, ["--model", stories(models_dir), "--max-batch", "16", "--kv-pages", "96", "--max-queue", "512"])
    yield s
    s.stop()


def test_health_models_metrics(server):
    assert server.request("GET", "/health")[:3:2] == (200, {"status": "ok"})
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["stories260K"]
    m = server.metrics()
    for name in ("flashlite_requests_running", "flashlite_requests_waiting", "flashlite_prompt_tokens_total",
                 "flashlite_generation_tokens_total", "flashlite_kv_pages_used", "flashlite_kv_pages_free",
                 "flashlite_time_to_first_token_seconds_count", "flashlite_inter_token_latency_seconds_count",
                 "flashlite_batch_size_count"):
        assert name in m, name
    assert m["flashlite_kv_pages_total"] == 96 and m["flashlite_kv_page_size"] == 16


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_completion_equals_generate(server, flashlite_bin, models_dir, prompt):
    want = generate(flashlite_bin, models_dir, prompt, 60)
    r = client(server).completions.create(model="stories260K", prompt=prompt, max_tokens=60, temperature=0)
    assert r.choices[0].text == want["text"]
    assert r.usage.prompt_tokens == len(want["prompt_ids"]) and r.usage.completion_tokens == len(want["ids"])
    assert r.choices[0].finish_reason == ("length" if len(want["ids"]) == 60 else "stop")
    assert r.object == "text_completion" and r.model == "stories260K" and r.id.startswith("cmpl-")


def test_sampling_with_seed_equals_generate(server, flashlite_bin, models_dir):
    opts = dict(temperature=0.9, top_p=0.95)
    want = generate(flashlite_bin, models_dir, "Lily", 40, "--temperature", "0.9", "--top-p", "0.95", "--top-k", "40",
                    "--seed", "7")
    c = client(server)
    a = c.completions.create(model="stories260K", prompt="Lily", max_tokens=40, seed=7, extra_body={"top_k": 40}, **opts)
    b = c.completions.create(model="stories260K", prompt="Lily", max_tokens=40, seed=7, extra_body={"top_k": 40}, **opts)
    other = c.completions.create(model="stories260K", prompt="Lily", max_tokens=40, seed=8, extra_body={"top_k": 40}, **opts)
    assert a.choices[0].text == want["text"] == b.choices[0].text
    assert other.choices[0].text != a.choices[0].text


def test_chat_stream_matches_non_stream_and_reports_usage(server):
    c = client(server)
    messages = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
    full = c.chat.completions.create(model="stories260K", messages=messages, max_tokens=50, temperature=0)
    msg = full.choices[0].message
    assert msg.role == "assistant" and len(msg.content) > 20 and full.object == "chat.completion"
    chunks = list(c.chat.completions.create(model="stories260K", messages=messages, max_tokens=50, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == msg.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens
    assert full.usage.completion_tokens <= 50 and full.usage.prompt_tokens > 3
    without = list(c.chat.completions.create(model="stories260K", messages=messages, max_tokens=5, temperature=0, stream=True))
    assert all(ch.usage is None for ch in without)


def test_n_choices_each_equal_its_seed_alone(server):
    # Choice i is a sequence of its own sampled with seed + i: the answer a request with that seed gets alone.
    c = client(server)
    opts = dict(model="stories260K", prompt="Lily", max_tokens=30, temperature=0.9, extra_body={"top_k": 40})
    r = c.completions.create(n=3, best_of=3, seed=11, **opts)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    alone = [c.completions.create(seed=11 + i, **opts) for i in range(3)]
    assert [ch.text for ch in r.choices] == [a.choices[0].text for a in alone]
    assert [ch.finish_reason for ch in r.choices] == [a.choices[0].finish_reason for a in alone]
    assert len({ch.text for ch in r.choices}) > 1
    assert r.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    m = server.wait_idle()
    assert m["flashlite_kv_pages_used"] == 0


def test_a_batch_of_prompts_answers_each_as_alone(server):
    # A completions batch (strings, or token-id arrays) with n choices each: choice p n + i is prompt p's answer to
    # seed + i alone; usage counts each prompt once. Streamed alike.
    c = client(server)
    opts = dict(model="stories260K", max_tokens=20, temperature=0.9, seed=5, extra_body={"top_k": 40})
    prompts = PROMPTS[:3]
    r = c.completions.create(prompt=prompts, n=2, **opts)
    assert [ch.index for ch in r.choices] == list(range(6))
    alone = [c.completions.create(prompt=p, seed=5 + i, **{k: v for k, v in opts.items() if k != "seed"})
             for p in prompts for i in range(2)]
    assert [ch.text for ch in r.choices] == [a.choices[0].text for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone[::2])
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    ids = [[1, 403, 407, 261, 378], [1, 403]]
    by_ids = c.completions.create(prompt=ids, max_tokens=8, temperature=0, model="stories260K")
    assert [ch.text for ch in by_ids.choices] == [
        c.completions.create(prompt=p, max_tokens=8, temperature=0, model="stories260K").choices[0].text for p in ids]
    texts = {}
    for ch in c.completions.create(prompt=prompts, n=2, stream=True, **opts):
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[i] for i in range(6)] == [ch.text for ch in r.choices]
    # Scoring a batch (echo, max_tokens 0): each prompt's logprobs as it gets them alone.
    scored = c.completions.create(model="stories260K", prompt=prompts, max_tokens=0, echo=True, logprobs=1)
    for p, ch in zip(prompts, scored.choices):
        one = c.completions.create(model="stories260K", prompt=p, max_tokens=0, echo=True, logprobs=1).choices[0]
        assert ch.text == p and ch.logprobs.token_logprobs == one.logprobs.token_logprobs


def test_n_choices_streamed_equal_their_non_streamed_answer(server):
    c = client(server)
    messages = [{"role": "user", "content": "Once upon a time"}]
    opts = dict(model="stories260K", messages=messages, max_tokens=40, temperature=0.8, seed=3, n=4)
    full = c.chat.completions.create(**opts)
    chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **opts))
    texts, roles, finals = {}, {}, {}
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.delta.role:
                roles[choice.index] = roles.get(choice.index, 0) + 1
            if choice.finish_reason:
                finals.setdefault(choice.index, []).append(choice.finish_reason)
    assert sorted(texts) == [0, 1, 2, 3] and roles == {i: 1 for i in range(4)}
    assert [texts[i] for i in range(4)] == [ch.message.content for ch in full.choices]
    assert finals == {i: [full.choices[i].finish_reason] for i in range(4)}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_n_choices_past_the_queue_are_refused_whole(start_server, models_dir):
    # 1 slot and a queue of 2: a request of 5 choices cannot be queued whole, so none of it runs.
    s = start_server(["--model", stories(models_dir), "--max-batch", "1", "--max-queue", "2"])
    body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 400, "n": 5, "ignore_eos": True}
    status, headers, err = s.request("POST", "/v1/completions", body)
    assert status == 503 and headers.get("Retry-After") == "1" and "busy" in err["error"]["message"]
    m = s.wait_idle()
    assert m["flashlite_kv_pages_used"] == 0 and m["flashlite_requests_running"] == 0
    assert m["flashlite_requests_finished_total"] == 0, m  # the queued choices were cancelled, not answered
    ok = s.request("POST", "/v1/completions", dict(body, n=2, max_tokens=20))
    assert ok[0] == 200 and [ch["index"] for ch in ok[2]["choices"]] == [0, 1]


def test_penalties_count_the_completions_own_tokens(server):
    # Greedy under OpenAI's presence and frequency penalties: each token must be the argmax, over the 20 most likely
    # tokens the server reports (log-softmax of the unpenalized logits), of the logprob lowered by presence once and
    # by frequency per earlier occurrence in this completion (not in the prompt).
    c = client(server)
    # The prompt holds the words the story goes on with: counted there too, they would be chosen less.
    messages = [{"role": "user", "content": "Once upon a time, there was a little girl named Lily. She liked to play "
                                            "in the park with her mom. One day, she saw a big dog in the park."}]
    opts = dict(model="stories260K", messages=messages, max_tokens=80, temperature=0, logprobs=True, top_logprobs=20)
    plain = c.chat.completions.create(**opts)
    r = c.chat.completions.create(presence_penalty=0.8, frequency_penalty=0.6, **opts)
    assert r.choices[0].message.content != plain.choices[0].message.content
    counts = {}
    for k, item in enumerate(r.choices[0].logprobs.content):
        alternatives = {t.token: t.logprob - 0.6 * counts.get(t.token, 0) - 0.8 * (t.token in counts)
                        for t in item.top_logprobs}
        assert item.token in alternatives, k
        assert item.token == max(alternatives, key=alternatives.get), (k, item.token, alternatives)
        counts[item.token] = counts.get(item.token, 0) + 1
    assert max(counts.values()) >= 2  # some token came back despite its penalty, and was counted
    zero = c.chat.completions.create(presence_penalty=0, frequency_penalty=0, **opts)
    assert zero.choices[0].message.content == plain.choices[0].message.content


def prompt_ids(flashlite_bin, models_dir, text):
    """stories260K's ids of `text` with BOS, as `flashlite tokenize` gives them (the server's prompt)."""
    cmd = [flashlite_bin, "tokenize", "--model", str(models_dir / "stories260K"), "--bos", "--json", "--text", text]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["ids"]


def score_logprobs(flashlite_bin, models_dir, ids, tmp_path, device="cpu"):
    """log-softmax of `flashlite score`'s teacher-forced logits (the generator's path, not the server's): the
    log-probability of each token after the first, given those before it."""
    out = tmp_path / "logits.npy"
    subprocess.run([flashlite_bin, "score", "--model", stories(models_dir), "--device", device, "--ids",
                    ",".join(map(str, ids)), "--out", str(out)], check=True, capture_output=True, timeout=120)
    logits = np.load(out).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return [float(logits[i, ids[i + 1]] - lse[i]) for i in range(len(ids) - 1)]


@pytest.mark.parametrize("chunk", [512, 3])
def test_echo_scores_the_prompt_as_score_does(start_server, flashlite_bin, models_dir, tmp_path, chunk):
    # echo + logprobs + max_tokens 0 (how evaluation harnesses score text): each prompt token's log-probability equals
    # `flashlite score`'s, whether the prompt prefills at once or in chunks of 3 (rows carried across chunks).
    s = start_server(["--model", stories(models_dir), "--prefill-chunk", str(chunk)])
    c = client(s)
    prompt = "Once upon a time, there was a little girl named Lily. She liked to play outside."
    r = c.completions.create(model="stories260K", prompt=prompt, max_tokens=0, echo=True, logprobs=3)
    ch = r.choices[0]
    assert ch.text == prompt and ch.finish_reason == "length" and r.usage.completion_tokens == 0
    lp = ch.logprobs
    ids = c.completions.create(model="stories260K", prompt=prompt, max_tokens=1, logprobs=0).usage.prompt_tokens
    assert len(lp.tokens) == ids == r.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens[1:]).strip() == prompt and lp.text_offset[1] == 0
    for k in range(1, len(lp.tokens)):
        piece = lp.tokens[k] if k > 1 else lp.tokens[k].lstrip(" ")  # (SentencePiece's dummy prefix: not text)
        assert prompt[lp.text_offset[k]:].startswith(piece), k
        assert len(lp.top_logprobs[k]) <= 3 and max(lp.top_logprobs[k].values()) >= lp.token_logprobs[k] - 1e-6
    token_ids = prompt_ids(flashlite_bin, models_dir, prompt)
    assert len(token_ids) == len(lp.tokens)
    want = score_logprobs(flashlite_bin, models_dir, token_ids, tmp_path)
    assert np.allclose(lp.token_logprobs[1:], want, atol=1e-4), (lp.token_logprobs[1:], want)
    # Generating after the echo: the prompt, then the text the request gets without echo; streamed alike.
    plain = c.completions.create(model="stories260K", prompt=prompt, max_tokens=12, temperature=0, logprobs=1)
    both = c.completions.create(model="stories260K", prompt=prompt, max_tokens=12, temperature=0, logprobs=1, echo=True)
    assert both.choices[0].text == prompt + plain.choices[0].text
    assert both.choices[0].logprobs.token_logprobs == lp.token_logprobs + plain.choices[0].logprobs.token_logprobs
    chunks = list(c.completions.create(model="stories260K", prompt=prompt, max_tokens=12, temperature=0, echo=True,
                                       stream=True))
    assert chunks[0].choices[0].text == prompt
    assert "".join(x.choices[0].text for x in chunks) == both.choices[0].text
    echo_only = c.completions.create(model="stories260K", prompt=prompt, max_tokens=0, echo=True)
    assert echo_only.choices[0].text == prompt and echo_only.choices[0].logprobs is None


def test_stop_strings_cut_the_text_streamed_or_not(server):
    c = client(server)
    base = c.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=60, temperature=0).choices[0].text
    stop = base[25:32]  # a piece in the middle, likely spanning tokens
    cut = base[:base.index(stop)]
    r = c.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=60, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    streamed = c.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=60, temperature=0,
                                    stop=stop, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed) == cut


def test_a_stop_string_ends_its_stream_while_the_batch_goes_on(server):
    # Stop strings are found by the server's emitter thread, after the scheduler may have sampled further tokens for
    # the request: the stream still ends with the text before the stop, finish_reason "stop", usage counting exactly
    # the tokens up to the one completing the stop (the ones the client got), then [DONE]; the requests beside it in
    # the batch run to their end.
    c = client(server)
    body = dict(model="stories260K", prompt="Once upon a time", max_tokens=60, temperature=0, logprobs=1)
    base = c.completions.create(**body).choices[0]
    stop = base.text[25:32]
    tokens = base.logprobs.tokens
    need = next(n for n in range(1, len(tokens) + 1) if stop in "".join(tokens[:n]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        others = [pool.submit(c.completions.create, model="stories260K", prompt=p, max_tokens=60, temperature=0,
                              extra_body={"ignore_eos": True}) for p in PROMPTS]
        chunks = list(c.completions.create(**body, stop=stop, stream=True, stream_options={"include_usage": True}))
        results = [f.result() for f in others]
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == base.text[:base.text.index(stop)]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]
    assert sum(len(ch.choices[0].logprobs.tokens) for ch in chunks if ch.choices) == need
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == need
    assert all(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 60 for r in results)
    assert server.wait_idle()["flashlite_kv_pages_used"] == 0


def test_logprobs(server):
    c = client(server)
    r = c.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "The cat"}], max_tokens=12,
                                  temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)  # greedy
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert bytes(t.bytes).decode() == t.token
    assert "".join(t.token for t in content).lstrip() == r.choices[0].message.content.lstrip()
    legacy = c.completions.create(model="stories260K", prompt="The cat", max_tokens=8, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == legacy.usage.completion_tokens
    assert all(len(top) <= 2 and max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    streamed = list(c.completions.create(model="stories260K", prompt="The cat", max_tokens=8, temperature=0, logprobs=2,
                                         stream=True))
    assert [o for ch in streamed for o in ch.choices[0].logprobs.text_offset] == lp.text_offset
    assert "".join(ch.choices[0].text for ch in streamed) == legacy.choices[0].text


def test_200_concurrent_requests_equal_their_answers_alone(server):
    # Mixed prompts and lengths, greedy and seeded sampling: each answer must equal the one it gets alone, whatever
    # else shares its batch (exactly: CPU fp32), and no KV page may stay taken.
    jobs = []
    for i in range(200):
        p = PROMPTS[i % len(PROMPTS)] + " " * (i % 3 == 2)
        job = {"model": "stories260K", "prompt": p, "max_tokens": 4 + (i * 7) % 60, "temperature": 0}
        if i % 4 == 3:
            job.update(temperature=0.8, seed=i)
        jobs.append(job)
    c = client(server, timeout=120)

    def run(job):
        r = c.completions.create(**job)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens

    alone = {}
    for job in jobs:
        key = json.dumps(job, sort_keys=True)
        if key not in alone:
            alone[key] = run(job)
    before = server.metrics()
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=200) as pool:
        together = list(pool.map(run, jobs))
    elapsed = time.time() - t0
    for job, got in zip(jobs, together):
        assert got == alone[json.dumps(job, sort_keys=True)], job
    m = server.wait_idle()
    assert m["flashlite_kv_pages_used"] == 0 and m["flashlite_kv_pages_free"] == 96
    steps = m["flashlite_steps_total"] - before["flashlite_steps_total"]
    rows = m["flashlite_batch_size_sum"] - before["flashlite_batch_size_sum"]
    assert rows / steps > 2, f"continuous batching should run several sequences per step ({rows} rows in {steps} steps)"
    assert m["flashlite_requests_failed_total"] == 0
    busy = m["flashlite_step_seconds_total"] - before["flashlite_step_seconds_total"]
    forward = m["flashlite_step_forward_seconds_total"] - before["flashlite_step_forward_seconds_total"]
    assert 0 < forward <= busy <= elapsed, (forward, busy, elapsed)
    print(f"200 concurrent requests in {elapsed:.2f} s, {rows / steps:.1f} sequences per step")


def test_long_prompts_prefill_in_chunks_while_others_decode(start_server, models_dir):
    # --prefill-chunk 8: a 58-token prompt takes 8 steps of prefill; the short requests beside it keep decoding, and
    # every answer is the one it gets alone.
    s = start_server(["--model", stories(models_dir), "--max-batch", "8", "--prefill-chunk", "8"])
    c = client(s)
    long_prompt = " ".join(PROMPTS) + " and then they all went home to sleep."
    jobs = [dict(prompt=long_prompt, max_tokens=40)] + [dict(prompt=p, max_tokens=60) for p in PROMPTS]

    def run(job):
        return c.completions.create(model="stories260K", temperature=0, extra_body={"ignore_eos": True}, **job).choices[0].text

    alone = [run(job) for job in jobs]
    before = s.metrics()
    prompt_tokens = c.completions.create(model="stories260K", prompt=long_prompt, max_tokens=1).usage.prompt_tokens
    after = s.metrics()
    assert prompt_tokens > 40 and after["flashlite_steps_total"] - before["flashlite_steps_total"] == -(-prompt_tokens // 8)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        together = list(pool.map(run, jobs))
    assert together == alone
    assert s.wait_idle()["flashlite_kv_pages_used"] == 0


BAD_REQUESTS = [
    # (path, body, status, words the message must hold)
    ("/v1/completions", b'{"model": "stories260K", "prompt": ', 400, "not valid JSON"),
    ("/v1/completions", b'[1, 2]', 400, "must be a JSON object"),
    ("/v1/completions", b'{"model": "stories260K", "prompt": "\xff\xfe"}', 400, "not valid JSON"),  # invalid UTF-8
    ("/v1/completions", b'{"model": "stories260K", "prompt": "a", "temperature": NaN}', 400, "not valid JSON"),
    ("/v1/completions", b'{"model": "stories260K", "prompt": "a", "temperature": 9e999}', 400, "not valid JSON"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "max_tokens": 2**63 - 1}, 400,
     "you requested 9223372036854775807 tokens"),
    ("/v1/completions", {"prompt": "a"}, 400, "'model' is required"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "a"}, 404, "does not exist"),
    ("/v1/completions", {"model": 7, "prompt": "a"}, 400, "must be a string"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "max_tokens": "10"}, 400, "must be an integer"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "max_tokens": 0}, 400, "at least 1 (0 with 'echo')"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "max_tokens": -5}, 400, "at least 1"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "max_tokens": 600}, 400, "maximum context length"),
    ("/v1/completions", {"model": "stories260K", "prompt": "the cat sat " * 300}, 400, "maximum context length"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "temperature": "hot"}, 400, "must be a number"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "n": 0}, 400, "'n' is 0; expected 1 to 128"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "n": 129}, 400, "'n' is 129"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "n": 2, "best_of": 3}, 400, "'best_of' must equal 'n'"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "best_of": 2}, 400, "'best_of' must equal 'n'"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "presence_penalty": 2.5}, 400, "expected -2 to 2"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "frequency_penalty": "x"}, 400, "must be a number"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "stop": [""]}, 400, "must not be empty"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "stop": 5}, 400, "'stop' must be"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "stream": "yes"}, 400, "must be a boolean"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"model": "stories260K", "prompt": []}, 400, "got an empty array"),
    ("/v1/completions", {"model": "stories260K", "prompt": ["a", 5]}, 400, "'prompt'[1] must be a string"),
    ("/v1/completions", {"model": "stories260K", "prompt": ["a", []]}, 400, "'prompt'[1] must be a string"),
    ("/v1/completions", {"model": "stories260K", "prompt": [[1, 2], [3, 99999]]}, 400, "'prompt'[1] token 99999"),
    ("/v1/completions", {"model": "stories260K", "prompt": ["a"] * 257}, 400, "at most 256"),
    ("/v1/completions", {"model": "stories260K", "prompt": ["a"] * 10, "n": 128}, 400, "sequences; at most 1024"),
    ("/v1/completions", {"model": "stories260K", "prompt": ["a", "the cat sat " * 300]}, 400, "your prompt 1 resulted"),
    ("/v1/completions", {"model": "stories260K", "prompt": [1, 99999]}, 400, "not an id"),
    ("/v1/completions", {"model": "stories260K", "prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": []}, 400, "empty"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": "hi"}, 400, "must be an array"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": [{"role": "tool", "content": "x"}]}, 400, "not supported"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": [{"role": "wizard", "content": "x"}]}, 400, "not supported"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": [{"role": "user"}]}, 400, "content is required"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     400, "only text"),
    ("/v1/chat/completions", {"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
     400, "needs 'logprobs'"),
    ("/v1/chat/completions", b'{"model": "stories260K", "messages": [{"role": "user", "content": "' + b"a" * (2 << 20) + b'"}]}',
     413, "too large"),
    ("/v1/nothing", {"model": "stories260K"}, 404, "No route"),
]


def test_bad_input_gets_openai_errors_and_the_server_keeps_serving(server, flashlite_bin, models_dir):
    for path, body, status, words in BAD_REQUESTS:
        got, _, err = server.request("POST", path, body, {"Content-Type": "application/json"})
        assert got == status, (path, body if isinstance(body, dict) else body[:80], err)
        assert isinstance(err, dict) and words in err["error"]["message"], (body if isinstance(body, dict) else body[:80], err)
        assert err["error"]["type"] and "code" in err["error"] and "param" in err["error"]
    with pytest.raises(openai.BadRequestError):
        client(server).completions.create(model="stories260K", prompt="a", max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client(server).completions.create(model="nope", prompt="a")
    want = generate(flashlite_bin, models_dir, "The dog", 30)
    r = client(server).completions.create(model="stories260K", prompt="The dog", max_tokens=30, temperature=0)
    assert r.choices[0].text == want["text"]
    m = server.wait_idle()
    assert m["flashlite_kv_pages_used"] == 0 and m["flashlite_requests_failed_total"] == 0


def sse_request(url, body):
    """A raw streaming request on a socket of our own, so the test decides when the client goes away."""
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


@pytest.mark.parametrize("n", [1, 3])
def test_client_disconnect_mid_stream_cancels_and_frees_pages(start_server, models_dir, n):
    s = start_server(["--model", stories(models_dir), "--max-batch", "32"])
    c = client(s, timeout=120)
    # Other requests keep the batch busy, so the streamed one is still generating when its client leaves.
    background = concurrent.futures.ThreadPoolExecutor(max_workers=31)
    others = [background.submit(c.completions.create, model="stories260K", prompt=p, max_tokens=480, temperature=0,
                                extra_body={"ignore_eos": True}) for p in PROMPTS * 5]
    sock = sse_request(s.url, {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                               "stream": True, "n": n})
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    sock.close()
    results = [f.result() for f in others]
    assert all(r.usage.completion_tokens > 0 for r in results)
    m = s.wait_idle()
    assert m["flashlite_requests_cancelled_total"] == n, m  # every choice
    assert m["flashlite_kv_pages_used"] == 0 and m["flashlite_requests_running"] == 0


def test_slow_reader_holds_up_nobody(start_server, models_dir):
    # A streaming client that reads nothing: the scheduler never waits on a client, so others are served, its own
    # generation ends and frees its pages, and what it reads later is the whole stream.
    s = start_server(["--model", stories(models_dir), "--max-batch", "4"])
    sock = sse_request(s.url, {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0,
                               "stream": True, "ignore_eos": True, "logprobs": 5})
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r = client(s).completions.create(model="stories260K", prompt="The dog", max_tokens=20, temperature=0)
    assert r.usage.completion_tokens >= 1
    m = s.wait_idle()
    assert m["flashlite_requests_running"] == 0 and m["flashlite_kv_pages_used"] == 0
    received = b""
    while not received.endswith(b"data: [DONE]\r\n\r\n") and not received.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    sock.close()
    # One logprob per token; a chunk that only ends the stream carries an empty list.
    assert len(re.findall(rb'"token_logprobs":\[[^\]]', received)) == 300 and b"data: [DONE]" in received


def test_queue_limit_answers_503_with_retry_after(start_server, models_dir):
    s = start_server(["--model", stories(models_dir), "--max-batch", "1", "--max-queue", "2"])
    body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda _: s.request("POST", "/v1/completions", body), range(16)))
    busy = [a for a in answers if a[0] == 503]
    ok = [a for a in answers if a[0] == 200]
    assert len(busy) + len(ok) == 16 and busy and len(ok) >= 3, [a[0] for a in answers]
    assert all(a[1].get("Retry-After") == "1" and "busy" in a[2]["error"]["message"] for a in busy)
    assert len({a[2]["choices"][0]["text"] for a in ok}) == 1  # same greedy answer, whoever waited
    m = s.wait_idle()
    assert m["flashlite_requests_rejected_total"] == len(busy) and m["flashlite_kv_pages_used"] == 0


def test_no_queue_still_serves_what_fits(start_server, models_dir):
    # --max-queue 0: nothing waits, but a request a free slot takes at once is not waiting.
    s = start_server(["--model", stories(models_dir), "--max-batch", "2", "--max-queue", "0"])
    body = {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 5}
    assert [s.request("POST", "/v1/completions", body)[0] for _ in range(3)] == [200] * 3


def test_api_key(start_server, models_dir):
    s = start_server(["--model", stories(models_dir), "--api-key", "sekret"])
    body = {"model": "stories260K", "prompt": "a", "max_tokens": 2}
    status, _, err = s.request("POST", "/v1/completions", body)
    assert status == 401 and err["error"]["type"] == "authentication_error"
    assert s.request("POST", "/v1/completions", body, {"Authorization": "Bearer wrong"})[0] == 401
    assert s.request("GET", "/v1/models")[0] == 401
    assert s.request("GET", "/health")[0] == 200
    with pytest.raises(openai.AuthenticationError):
        client(s, api_key="wrong").completions.create(**body)
    assert client(s, api_key="sekret").completions.create(**body).usage.completion_tokens >= 1


def test_port_in_use_is_an_error(start_server, flashlite_bin, models_dir):
    s = start_server(["--model", stories(models_dir)])
    port = s.url.rsplit(":", 1)[1]
    proc = subprocess.run([flashlite_bin, "serve", "--model", stories(models_dir), "--port", port], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr, proc.stderr


def test_a_kv_cache_too_small_for_one_page_is_an_error(flashlite_bin, models_dir):
    proc = subprocess.run([flashlite_bin, "serve", "--model", stories(models_dir), "--port", "0", "--kv-memory", "1e-6"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--kv-memory holds no KV page of" in proc.stderr, proc.stderr
    assert "listening" not in proc.stderr


def test_sigint_during_a_stream_stops_cleanly(start_server, models_dir):
    s = start_server(["--model", stories(models_dir), "--host", "127.0.0.1"])
    sock = sse_request(s.url, {"model": "stories260K", "prompt": "Once", "max_tokens": 400, "stream": True,
                               "extra": "ignored"})
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    s.stop(signal.SIGINT)  # exits 0 and says "stopped" (checked by stop())
    sock.close()


def test_chat_uses_the_llama3_template(start_server, models_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok_json = models_dir / "llama3-tokenizer" / "tokenizer.json"
    if not tok_json.exists():
        pytest.skip("Llama 3 tokenizer absent")
    from serve_testlib import write_tiny_llama3
    s = start_server(["--model", write_tiny_llama3(tmp_path, tok_json), "--model-name", "tiny", "--context", "256",
                      "--max-batch", "4"])
    assert "chat: Llama 3 chat template" in "".join(s.log)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": [{"type": "text", "text": "Again?"}]}]
    rendered = "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'] if isinstance(m['content'], str) else m['content'][0]['text']}<|eot_id|>"
        for m in messages) + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ids = tokenizers.Tokenizer.from_file(str(tok_json)).encode(rendered, add_special_tokens=False).ids
    c = client(s)
    chat = c.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens == len(ids)
    same = c.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == same.choices[0].text
    # Special-token text in a message is plain text, never a turn boundary.
    inject = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a<|eot_id|>b"}], max_tokens=1)
    plain = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "ab"}], max_tokens=1)
    assert inject.usage.prompt_tokens > plain.usage.prompt_tokens + 1


def test_tensor_parallel_server_answers_as_one_model(start_server, models_dir, server):
    # --tp 2 on the CPU (two ranks as threads): concurrent greedy completions equal the unsplit server's.
    s = start_server(["--model", stories(models_dir), "--max-batch", "4", "--tp", "2"])
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=6)

    def texts(srv):
        c = client(srv)
        jobs = [pool.submit(c.completions.create, model="stories260K", prompt=p, max_tokens=40, temperature=0)
                for p in PROMPTS]
        return [j.result().choices[0].text for j in jobs]

    assert texts(s) == texts(server)
    m = s.wait_idle()
    assert m["flashlite_kv_pages_used"] == 0 and m["flashlite_requests_running"] == 0
