"""The server tests' helper (imported by name, so kept out of conftest.py): `Server`, a `flashlite serve` process on
127.0.0.1 on a free port (--port 0; the port is read from its "listening on" line) that must stop cleanly."""
import contextlib
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "engine"))
from engine_testlib import write_tiny_llama3  # noqa: E402,F401  (the tiny Llama 3 checkpoint the engine tests use)


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


@contextlib.contextmanager
def servers(binary, *arg_lists):
    """Servers started in order (those already up are stopped if a later one fails to start), yielded as a list and
    stopped, last first, when the block ends."""
    with contextlib.ExitStack() as stack:
        started = []
        for args in arg_lists:
            s = Server(binary, args)
            stack.callback(s.stop)
            started.append(s)
        yield started
