"""The repository itself: no SQLite side files are tracked (a WAL or SHM file is transient state of a
connection, and a tracked one can hold measurements the main database file does not)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_no_sqlite_wal_or_shm_file_is_tracked():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        pytest.skip("git ls-files failed: not a usable git checkout")
    files = [f for f in r.stdout.decode().split("\0") if f]
    assert files, "git ls-files listed nothing"
    bad = [f for f in files if f.endswith(("-wal", "-shm", "-journal"))]
    assert not bad, f"tracked SQLite side files: {bad}"
