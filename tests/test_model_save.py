"""Cost-model saves are atomic, and a damaged updated model next to a database falls back to the shipped one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from collage_ml.models import ArtifactError, load_model
from collage_ml.models import base as models_base
from collage_ml.models.feedback import resolve_cost_model, updated_path


@pytest.fixture(scope="module")
def shipped():
    return next(p for p, m in models_base.shipped_artifacts() if m.get("kind") == "xgb")


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_save_killed_midway_leaves_the_old_artifact(tmp_path, shipped):
    d = shutil.copytree(shipped, tmp_path / "m")
    before = _snapshot(d)
    script = textwrap.dedent("""
        import os, signal, sys
        from collage_ml.models import load_model
        from collage_ml.models.xgb import XGBCostModel

        m = load_model(sys.argv[1])
        def dying(self, directory):  # writes one member of the new artifact, then the process is killed
            self.members[0].save_model(str(directory / "member-0.json"))
            os.kill(os.getpid(), signal.SIGKILL)
        XGBCostModel._save_payload = dying
        m.meta["updates"] = 12345
        m.save(sys.argv[1])
    """)
    r = subprocess.run([sys.executable, "-c", script, str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr[-500:]
    assert _snapshot(d) == before  # not one byte of the old artifact changed
    m = load_model(d)
    assert m.meta.get("updates") != 12345
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.")]
    assert leftovers, "the killed save should have left its temporary folder"
    m.meta["updates"] = 7
    m.save(d)  # the next save replaces the artifact and removes what the killed one left
    assert load_model(d).meta["updates"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert set(_snapshot(d)) == set(before)


def test_a_failed_save_keeps_the_old_artifact_and_cleans_up(tmp_path, shipped, monkeypatch):
    from collage_ml.models.xgb import XGBCostModel

    d = shutil.copytree(shipped, tmp_path / "m")
    before = _snapshot(d)
    m = load_model(d)

    def failing(self, directory):
        (directory / "member-0.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(XGBCostModel, "_save_payload", failing)
    with pytest.raises(OSError):
        m.save(d)
    assert _snapshot(d) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_save_never_replaces_a_folder_that_is_not_an_artifact(tmp_path, shipped):
    m = load_model(shipped)
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="not a cost-model artifact"):
        m.save(home)
    assert (home / "notes.txt").read_text() == "mine"
    m.save(tmp_path / "new")  # a new folder, and an empty one, are fine
    (tmp_path / "empty").mkdir()
    m.save(tmp_path / "empty")
    assert json.loads((tmp_path / "empty" / "meta.json").read_text())["kind"] == "xgb"


def test_damaged_updated_model_warns_once_and_uses_the_shipped_one(tmp_path, shipped, monkeypatch, capsys):
    monkeypatch.setattr(models_base, "default_artifact", lambda *a, **k: shipped)  # any CPU
    db = tmp_path / "m.db"
    fp = "cpu-test-t2-000000000000"
    p = updated_path(db, fp, "xgb")
    shutil.copytree(shipped, p)
    (p / "member-1.json").write_bytes(b"")  # what a kill during the old, in-place save could leave
    capsys.readouterr()
    for _ in range(2):
        model, source, save_to = resolve_cost_model("default", db, fp)
        assert source == "shipped default" and save_to == p and model.kind == "xgb"
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and str(p) in err and "does not load" in err, err
    model.save(save_to)  # the next update heals it
    assert resolve_cost_model("default", db, fp)[1] == str(p)
