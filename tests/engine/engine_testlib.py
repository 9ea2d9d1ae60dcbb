"""Helpers for the engine's pytest files (imported by name, so kept out of conftest.py)."""
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_cli(binary, args, stdin=None, check=True):
    """Runs the CLI; returns the CompletedProcess (bytes in, bytes out)."""
    proc = subprocess.run([binary, *args], input=stdin, capture_output=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"flashlite {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    return proc


def model_absent(message):
    """Ends a test whose model files are absent: a skip, or a failure where FLASHLITE_REQUIRE_MODELS=1 (CI)."""
    import os
    import pytest
    if os.environ.get("FLASHLITE_REQUIRE_MODELS") == "1":
        pytest.fail(f"{message} (FLASHLITE_REQUIRE_MODELS=1)")
    pytest.skip(message)
