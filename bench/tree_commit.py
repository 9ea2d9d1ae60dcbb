"""The commit a benchmark's JSON records: $FLASHLITE_COMMIT (a tree without .git, e.g. on the GPU machine), else the
git HEAD of this checkout, else "unknown" (bench/readme_tables.py refuses results without a commit). The bench
scripts import it with bench/ on sys.path."""
import os
import pathlib
import subprocess


def tree_commit():
    if os.environ.get("FLASHLITE_COMMIT"):
        return os.environ["FLASHLITE_COMMIT"]
    here = pathlib.Path(__file__).resolve().parent
    try:
        r = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True)
        return r.stdout.strip() or "unknown"
    except OSError:
        return "unknown"
