"""The server tests' helper (imported by name, so kept out of conftest.py): `Server`, a `flashlite serve` process on
127.0.0.1 on a free port (--port 0; the port is read from its "listening on" line) that must stop cleanly."""
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request


class Server:
    """`flashlite serve ARGS --port 0`; stop() sends SIGTERM (or `sig`) and checks it exits 0 within a few seconds."""

    def __init__(self, binary, args):
        self.proc = subprocess.Popen([binary, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            if line.startswith("listening on http://"):
                self.url = line.split()[-1]
                break
        else:
            line = ""
        if not hasattr(self, "url"):
            self.proc.kill()
            raise AssertionError("the server did not start: " + "".join(self.log) + self.proc.stderr.read())
        # Keep draining stderr so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self._drain.start()

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers, parsed JSON or text) of one HTTP request; body: dict (sent as JSON) or bytes."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, hdrs, raw = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, raw = e.code, dict(e.headers), e.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw.decode(errors="replace")

    def metrics(self):
        status, _, text = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_idle(self, timeout=20):
        """Metrics once nothing runs or waits (requests leave the batch at the scheduler's next step)."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if (m["flashlite_requests_running"] == 0 and m["flashlite_requests_waiting"] == 0) or time.time() > deadline:
                return m
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 15 s of the signal")
        self._drain.join(timeout=5)
        assert code == 0, f"the server exited with {code}: " + "".join(self.log)
        assert "stopped" in "".join(self.log), "".join(self.log)


def write_tiny_llama3(directory, tokenizer_json):
    """A tiny random Llama checkpoint (2 layers, dim 32) with the real Llama 3 vocabulary and tokenizer, for the chat
    template: F32 safetensors written by hand, config.json, tokenizer.json copied beside."""
    import numpy as np
    import shutil
    import struct
    rng = np.random.default_rng(0)
    dim, hidden, layers, heads, kv, vocab = 32, 64, 2, 4, 2, 128256
    hd = dim // heads
    tensors = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, dim)), "model.norm.weight": np.ones(dim)}
    shapes = {"self_attn.q_proj": (heads * hd, dim), "self_attn.k_proj": (kv * hd, dim), "self_attn.v_proj": (kv * hd, dim),
              "self_attn.o_proj": (dim, heads * hd), "mlp.gate_proj": (hidden, dim), "mlp.up_proj": (hidden, dim),
              "mlp.down_proj": (dim, hidden)}
    for i in range(layers):
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.ones(dim)
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = np.ones(dim)
        for name, shape in shapes.items():
            tensors[f"model.layers.{i}.{name}.weight"] = rng.normal(0, 0.2, shape)
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dim, "intermediate_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
           "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}
    (directory / "config.json").write_text(json.dumps(cfg))
    shutil.copy(tokenizer_json, directory / "tokenizer.json")
    return directory
