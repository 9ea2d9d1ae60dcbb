"""Fixtures for the CLI's own pytest files: the flashlite binary (FLASHLITE_BIN, else build/bin/flashlite)."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def flashlite_bin():
    path = pathlib.Path(os.environ.get("FLASHLITE_BIN", REPO / "build" / "bin" / "flashlite"))
    if not path.exists() and os.environ.get("FLASHLITE_BIN"):  # named explicitly (scripts/test.sh does): must exist
        pytest.fail(f"FLASHLITE_BIN={path} does not exist")
    if not path.exists():
        pytest.skip(f"flashlite binary not found at {path} (build it, or set FLASHLITE_BIN)")
    return str(path)
