"""Fixtures for the server's tests: the flashlite binary (built with the server), the shared models, and
start_server (serve_testlib.Server processes stopped and checked at the end of a test)."""
import os
import pathlib
import subprocess

import pytest

from serve_testlib import Server

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def flashlite_bin():
    path = pathlib.Path(os.environ.get("FLASHLITE_BIN", REPO / "build" / "bin" / "flashlite"))
    if not path.exists() and os.environ.get("FLASHLITE_BIN"):
        pytest.fail(f"FLASHLITE_BIN={path} does not exist")
    if not path.exists():
        pytest.skip(f"flashlite binary not found at {path} (build it, or set FLASHLITE_BIN)")
    help_text = subprocess.run([str(path), "serve", "--help"], capture_output=True, text=True).stdout
    if "--max-batch" not in help_text:  # built without cpp-httplib
        message = f"{path} was built without the server (cpp-httplib missing)"
        if os.environ.get("FLASHLITE_REQUIRE_MODELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return str(path)


@pytest.fixture(scope="session")
def models_dir():
    path = pathlib.Path(os.environ.get("FLASHLITE_MODELS", REPO.parent / "shared" / "models"))
    stories = path / "stories260K" / "stories260K.bin"
    if not stories.exists():
        message = f"stories260K absent at {stories} (expected ../shared/models relative to the repo)"
        if os.environ.get("FLASHLITE_REQUIRE_MODELS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def start_server(flashlite_bin):
    """start_server(args) -> a running Server, stopped (and checked) at the end of the test."""
    servers = []

    def start(args):
        servers.append(Server(flashlite_bin, [str(a) for a in args]))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()
