#!/usr/bin/env python3
"""Load on `flashlite serve`, as `vllm bench serve` measures a server: streamed /v1/completions requests with prompts
and output lengths drawn from a fixed, seeded distribution, sent at fixed concurrency (N clients, each sending its
next request when the last one ended) and at Poisson request rates (arrivals with exponential gaps, each request on
its own client). Per run: request throughput, output tokens/s, TTFT, inter-token latency (the gaps between streamed
tokens after the first) and end-to-end latency, p50 / p90 / p99, and the server's own mean batch size per step and
mean TTFT (/metrics). At fixed concurrency the clients are spread over processes (--procs), so that parsing the
streams never limits what is measured. Outputs ignore EOS (`ignore_eos`, as vLLM's benchmark does) so every request
runs its drawn length. Requests the server sheds with 503 (queue full) are counted apart; latencies are over the
completed ones.

    python3 bench/serve/load.py --model ../shared/models/stories260K --concurrency 1,16,64 --out serve_cpu.json
    python3 bench/serve/load.py --model HF_DIR --device cuda --concurrency 1,64 --rates 4,16,64 --out serve.json \\
        --plot serve.png
    python3 bench/serve/load.py --url http://127.0.0.1:8080 ...     # a server already running

--model starts `flashlite serve` (the binary: --flashlite, default build/bin/flashlite) on a free port and stops it.
"""
import argparse
import http.client
import json
import multiprocessing
import os
import pathlib
import queue
import random
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "serve"))  # serve_testlib.Server: start, wait for "listening", stop
sys.path.insert(0, str(ROOT / "bench"))
from tree_commit import tree_commit  # noqa: E402

WORDS = ("once upon a time there was a little girl who lived in a small house near the big forest and every day "
         "she went out to play with her dog in the sun").split()


def workload(n, seed, prompt_words, output_tokens):
    """n (prompt, max_tokens) pairs: prompt lengths uniform in prompt_words words, outputs uniform in output_tokens."""
    rng = random.Random(seed)
    return [(" ".join(rng.choice(WORDS) for _ in range(rng.randint(*prompt_words))), rng.randint(*output_tokens))
            for _ in range(n)]


def one_request(url, model, prompt, max_tokens, api_key):
    """Streams one completion; returns its timings (s) and token count, or an error."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    start = time.perf_counter()
    arrivals, usage = [], None
    try:
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        if resp.status == 503:  # the server's queue is full: shed load, as it should past --max-queue
            return {"rejected": True, "error": f"HTTP 503: {resp.read()[:200]!r}"}
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    except Exception as e:  # a broken stream (OSError, IncompleteRead, bad JSON or UTF-8) fails this request only
        return {"error": repr(e)}
    finally:
        conn.close()
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else len(arrivals)
    # Text arrives per token except where a multi-byte character is held back: the gaps are per released chunk.
    return {"ttft": (arrivals[0] if arrivals else end) - start, "e2e": end - start, "tokens": tokens,
            "itl": [b - a for a, b in zip(arrivals, arrivals[1:])]}


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def summarize(results, wall, mode, value):
    ok = [r for r in results if "error" not in r]
    itl = [g for r in ok for g in r["itl"]]
    rejected = sum(1 for r in results if r.get("rejected"))
    row = {"mode": mode, mode: value, "requests": len(results), "rejected_503": rejected,
           "failed": len(results) - len(ok) - rejected,
           "duration_s": wall, "request_throughput": len(ok) / wall,
           "output_tok_s": sum(r["tokens"] for r in ok) / wall}
    for name, vals in (("ttft_ms", [r["ttft"] for r in ok]), ("itl_ms", itl), ("e2e_ms", [r["e2e"] for r in ok])):
        row[name] = {f"p{q}": (pct(vals, q) or 0) * 1e3 for q in (50, 90, 99)}
        row[name]["mean"] = statistics.fmean(vals) * 1e3 if vals else 0
    errors = [r["error"] for r in results if "error" in r and not r.get("rejected")]
    if errors:
        row["first_error"] = errors[0]
    return row


def _clients(url, model, api_key, threads, take):
    """`threads` clients, each sending the next request take() hands it (None: no more) when its last one ended;
    returns their results."""
    results, lock = [], threading.Lock()

    def client():
        while (item := take()) is not None:
            r = one_request(url, model, *item, api_key)
            with lock:
                results.append(r)

    pool = [threading.Thread(target=client) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


def _client_process(url, model, api_key, threads, work_q, results_q, barrier):
    """One process of run_concurrency: its clients take requests from work_q once every process is ready; their
    results go to results_q at the end."""
    barrier.wait()
    results_q.put(_clients(url, model, api_key, threads, work_q.get))


def run_concurrency(args, conc, work):
    # Parsing a stream costs the client tens of microseconds per token in Python: one process (one GIL) tops out near
    # the server's rate at high concurrency, so the clients are spread over processes (--procs).
    procs = min(conc, args.procs or max(1, min(os.cpu_count() or 1, conc // 8)))
    if procs > 1:
        ctx = multiprocessing.get_context("spawn")
        work_q, results_q, barrier = ctx.Queue(), ctx.Queue(), ctx.Barrier(procs + 1)
        for item in work:
            work_q.put(item)
        for _ in range(conc):
            work_q.put(None)
        per = [conc // procs + (i < conc % procs) for i in range(procs)]
        ps = [ctx.Process(target=_client_process, args=(args.url, args.model_name, args.api_key, n, work_q, results_q,
                                                        barrier)) for n in per]
        for p in ps:
            p.daemon = True
            p.start()
        try:
            barrier.wait(timeout=120)  # every process has started (imports done): the clock starts now
            t0 = time.perf_counter()
            results, done = [], 0
            while done < procs:  # a client process that dies ends the run instead of hanging it
                try:
                    results += results_q.get(timeout=1)
                    done += 1
                except queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in ps):
                        raise RuntimeError("a load-generator process died") from None
            wall = time.perf_counter() - t0
        except threading.BrokenBarrierError:
            raise RuntimeError("the load-generator processes did not start") from None
        finally:
            for p in ps:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
        row = summarize(results, wall, "concurrency", conc)
        row["client_processes"] = procs
        return row
    it, lock = iter(work), threading.Lock()

    def take():
        with lock:
            return next(it, None)

    t0 = time.perf_counter()
    results = _clients(args.url, args.model_name, args.api_key, conc, take)
    row = summarize(results, time.perf_counter() - t0, "concurrency", conc)
    row["client_processes"] = 1
    return row


def run_rate(args, rate, work):
    results, lock, threads = [], threading.Lock(), []
    rng = random.Random(args.seed + 1)

    def client(item):
        r = one_request(args.url, args.model_name, *item, args.api_key)
        with lock:
            results.append(r)

    t0 = time.perf_counter()
    due = t0
    for item in work:
        due += rng.expovariate(rate)
        time.sleep(max(0.0, due - time.perf_counter()))
        threads.append(threading.Thread(target=client, args=(item,)))
        threads[-1].start()
    for t in threads:
        t.join()
    return summarize(results, time.perf_counter() - t0, "rate", rate)


def batch_stats(server_metrics):
    """The server's counters a run's row reports as differences: batch size per step, TTFT (arrival at the server
    to its first token), the scheduler's busy time and its forward calls' time."""
    m = server_metrics()
    ttft = "flashlite_time_to_first_token_seconds"
    return (m.get("flashlite_batch_size_sum", 0), m.get("flashlite_batch_size_count", 0), m.get(ttft + "_sum", 0),
            m.get(ttft + "_count", 0), m.get("flashlite_step_seconds_total", 0),
            m.get("flashlite_step_forward_seconds_total", 0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="start `flashlite serve -m MODEL` for the run")
    ap.add_argument("--url", help="or use this running server")
    ap.add_argument("--flashlite", default=str(ROOT / "build" / "bin" / "flashlite"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--serve-args", default="", help="more `flashlite serve` arguments")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--rates", default="", help="Poisson request rates (requests/s), e.g. 4,16,64")
    ap.add_argument("--requests", type=int, default=0, help="per run (default: max(32, 4 x concurrency or rate))")
    ap.add_argument("--procs", type=int, default=0,
                    help="client processes at fixed concurrency (default: one per 8 clients, at most one per core)")
    ap.add_argument("--prompt-words", default="8,64", help="prompt length range, words")
    ap.add_argument("--output-tokens", default="32,128", help="output length range, tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON results")
    ap.add_argument("--plot", help="PNG: output tokens/s against p90 end-to-end latency (needs matplotlib)")
    args = ap.parse_args(argv)
    if bool(args.model) == bool(args.url):
        ap.error("give exactly one of --model and --url")
    prompt_words = tuple(map(int, args.prompt_words.split(",")))
    output_tokens = tuple(map(int, args.output_tokens.split(",")))

    server = None
    if args.model:
        from serve_testlib import Server
        server = Server(args.flashlite, ["-m", args.model, "--device", args.device, "--max-batch", str(args.max_batch),
                                         *args.serve_args.split()])
        args.url = server.url
    try:
        with urllib.request.urlopen(args.url + "/v1/models") as r:
            models = json.loads(r.read())
        args.model_name = models["data"][0]["id"]
        metrics = server.metrics if server else None
        res = {"benchmark": "serve load", "commit": tree_commit(), "url": args.url, "model": args.model_name,
               "device": args.device, "max_batch": args.max_batch, "prompt_words": prompt_words,
               "output_tokens": output_tokens, "seed": args.seed, "protocol": __doc__.strip().split("\n\n")[0],
               "rows": []}
        one_request(args.url, args.model_name, "warm up", 8, args.api_key)
        plan = [("concurrency", int(c)) for c in args.concurrency.split(",") if c]
        plan += [("rate", float(r)) for r in args.rates.split(",") if r]
        for mode, value in plan:
            n = args.requests or max(32, int(4 * value))
            work = workload(n, args.seed, prompt_words, output_tokens)
            before = batch_stats(metrics) if metrics else (0,) * 6
            row = (run_concurrency if mode == "concurrency" else run_rate)(args, int(value) if mode == "concurrency"
                                                                            else value, work)
            if metrics:
                after = batch_stats(metrics)
                steps = after[1] - before[1]
                row["mean_batch"] = (after[0] - before[0]) / steps if steps else 0
                firsts = after[3] - before[3]
                row["server_ttft_mean_ms"] = (after[2] - before[2]) / firsts * 1e3 if firsts else 0
                # per step: the scheduler's busy time, and of it the forward call (the rest: host work between steps)
                row["server_step_ms"] = (after[4] - before[4]) / steps * 1e3 if steps else 0
                row["server_forward_ms"] = (after[5] - before[5]) / steps * 1e3 if steps else 0
            res["rows"].append(row)
            print(f"{mode} {value:>6}: {row['requests']} requests ({row['rejected_503']} rejected, "
                  f"{row['failed']} failed), "
                  f"{row['request_throughput']:.2f} req/s, {row['output_tok_s']:,.0f} tok/s, TTFT p50/p90 "
                  f"{row['ttft_ms']['p50']:.1f}/{row['ttft_ms']['p90']:.1f} ms, ITL p50/p90 "
                  f"{row['itl_ms']['p50']:.2f}/{row['itl_ms']['p90']:.2f} ms, E2E p90 {row['e2e_ms']['p90']:.0f} ms, "
                  + (f"mean batch {row['mean_batch']:.1f}, server TTFT mean {row['server_ttft_mean_ms']:.1f} ms, "
                     f"step {row['server_step_ms']:.2f} ms (forward {row['server_forward_ms']:.2f})"
                     if metrics else "(no server metrics: --url)"), flush=True)
    finally:
        if server:
            server.stop()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(res, indent=1))
        print("wrote", args.out)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, marker in (("concurrency", "o-"), ("rate", "s--")):
            rows = [r for r in res["rows"] if r["mode"] == mode]
            if rows:
                ax.plot([r["e2e_ms"]["p90"] for r in rows], [r["output_tok_s"] for r in rows], marker, label=mode)
                for r in rows:
                    ax.annotate(str(r[mode]), (r["e2e_ms"]["p90"], r["output_tok_s"]), fontsize=7)
        ax.set_xlabel("p90 end-to-end latency (ms)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"flashlite serve, {res['model']} on {res['device']} ({res['commit']})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return 0 if all(r["failed"] == 0 for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
