"""The kernel changes kept in bench/*/pending/ (correct on a GPU, or compiled, but not yet timed) still apply to the
tree, each alone: a change to the files they touch must regenerate them, or they rot before their GPU time."""
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PATCHES = sorted(REPO.glob("bench/*/pending/*.patch"))


def in_git_tree():
    if shutil.which("git") is None:
        return False
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                          text=True)
    return proc.returncode == 0 and proc.stdout.strip() == "true"


@pytest.mark.skipif(not PATCHES, reason="no pending patches")
@pytest.mark.skipif(not in_git_tree(), reason="not a git work tree (git apply --check needs one)")
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_pending_patch_applies(patch):
    text = patch.read_text()
    assert "diff --git" in text, f"{patch.name} holds no diff"
    assert text.index("diff --git") > 0, f"{patch.name} has no header saying what it is, its checks and its A/B"
    proc = subprocess.run(["git", "-C", str(REPO), "apply", "--check", str(patch)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{patch.name} no longer applies:\n{proc.stderr}"
