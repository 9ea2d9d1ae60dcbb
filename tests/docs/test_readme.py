"""The README's results tables are what bench/readme_tables.py renders from the committed JSON (device and commit
named in each), and the README's commands point at files that exist."""
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_results_tables_match_the_committed_json():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "readme_tables.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_readme_names_scripts_that_exist():
    text = (REPO / "README.md").read_text()
    for script in ("scripts/run.sh", "scripts/test.sh", "scripts/setup.sh", "scripts/requirements.txt",
                   "scripts/apt-packages.txt", "scripts/make-carry.sh", "scripts/gpu-check.sh", "tests/suites.txt",
                   "bench/readme_tables.py", "LICENSE"):
        assert script in text, f"README no longer mentions {script}"
        assert (REPO / script).exists(), f"README mentions {script}, which does not exist"
