"""Shared fixtures for the engine's pytest files: the flashlite binary and the shared models directory."""
import os
import pathlib

import pytest

from engine_testlib import REPO


def _binary():
    env = os.environ.get("FLASHLITE_BIN")
    if env:
        return pathlib.Path(env)
    return REPO / "build" / "bin" / "flashlite"


@pytest.fixture(scope="session")
def flashlite_bin():
    path = _binary()
    if not path.exists() and os.environ.get("FLASHLITE_BIN"):  # named explicitly (scripts/test.sh does): must exist
        pytest.fail(f"FLASHLITE_BIN={path} does not exist")
    if not path.exists():
        pytest.skip(f"flashlite binary not found at {path} (build it, or set FLASHLITE_BIN)")
    return str(path)


@pytest.fixture(scope="session")
def models_dir():
    path = pathlib.Path(os.environ.get("FLASHLITE_MODELS", REPO.parent / "shared" / "models"))
    if not path.is_dir():
        message = f"models directory {path} is absent (expected ../shared/models relative to the repo)"
        if os.environ.get("FLASHLITE_REQUIRE_MODELS") == "1":  # CI: missing models fail, never skip
            pytest.fail(message + " and FLASHLITE_REQUIRE_MODELS=1")
        pytest.skip(message)
    return path
