"""A candidate measured in several sittings (a dataset and its rerun) trains and scores as one sample."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from collage_ml.cli import main
from collage_ml.db import Database
from collage_ml.featurize.roofline import PROBE_NAMES
from collage_ml.measure.probes import PROBE_SET_VERSION
from collage_ml.models import dataset
from collage_ml.models.training import load_dataset

from .fake_hardware import fake_probes
from .test_evaluate import _build_db

XGB_SMALL = ["--param", "n_estimators=5", "--param", "n_members=1", "--param", "n_jobs=1"]


@pytest.fixture(scope="module")
def sitting_a(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("sittings") / "a.db"
    assert _build_db(p, models=(("dcgan", "dcgan"),)) > 20
    return p


def _rerun(a: Path, path: Path, factor: float, keep=lambda i: True, jitter: float = 1.0) -> Path:
    """A copy of ``a`` whose rows read ``factor`` times slower, the odd ids ``jitter`` times more, less the rows
    (by id) that ``keep`` refuses."""
    shutil.copy(a, path)
    with closing(sqlite3.connect(path)) as c, c:
        ids = [r[0] for r in c.execute("SELECT id FROM measurements ORDER BY id")]
        c.executemany("DELETE FROM measurements WHERE id = ?", [(i,) for i in ids if not keep(i)])
        c.execute("UPDATE measurements SET median = median * ?", (factor,))
        c.execute("UPDATE measurements SET median = median * ? WHERE id % 2 = 1", (jitter,))
    return path


def _calibrate(path: Path, scale: float) -> None:
    """One calibration of every fingerprint in ``path``: a synthetic machine ``scale`` times slower."""
    with Database(path) as d:
        for fp in d.stats()["hardware"]:
            for probe, sec in fake_probes(overhead=1e-5 * scale, scale=1.0 / scale).items():
                d.commit_probe(fp, "onnxruntime", "1", "m5", PROBE_SET_VERSION, probe, sec, "h")


def _by_key(ds) -> dict:
    return {(s.hardware, s.key): s for s in ds}


def test_a_rerun_merges_into_one_sample_at_the_geometric_mean(sitting_a, tmp_path, monkeypatch):
    """Too few shared candidates to scale by and no calibration: the raw latencies' geometric mean."""
    monkeypatch.setattr(dataset, "MIN_SHARED", 10**6)
    b = _rerun(sitting_a, tmp_path / "b.db", 4.0, keep=lambda i: i % 2 == 0)  # half the rows, 4x slower
    a_only, both = load_dataset(sitting_a), load_dataset([sitting_a, b])
    n_b = len(load_dataset(b))
    assert 0 < n_b < len(a_only)
    assert len(both) == len(a_only) and both.merged == {"candidates": n_b, "rows": 2 * n_b, "by_shared": 0}
    a_rows, b_keys = _by_key(a_only), set(_by_key(load_dataset(b)))
    for k, s in _by_key(both).items():
        if k in b_keys:  # sqrt(1 x 4) = 2x run A's
            assert s.sittings == 2 and s.latency == pytest.approx(2.0 * a_rows[k].latency)
        else:
            assert s.sittings == 1 and s.latency == a_rows[k].latency
    each = load_dataset([sitting_a, b], sittings="each")
    assert len(each) == len(a_only) + n_b and each.merged == {}
    with pytest.raises(ValueError, match="sittings must be one of mean, each"):
        load_dataset([sitting_a, b], sittings="median")


def test_a_sitting_is_put_on_the_first_ones_scale_by_the_candidates_they_share(sitting_a, tmp_path, monkeypatch):
    """The rerun ran everything 4x slower, and half its rows 1.21x more on top: scaled per backend by the
    median over the shared candidates, the merged labels are run A's times the rerun's own part, sqrt(1.21) =
    1.1 on the odd rows and 1 or 1/1.1 on the rest (the median falls on either side), not the raw 2x-2.2x."""
    a_rows = _by_key(load_dataset(sitting_a))
    backends = {s.backend for s in a_rows.values()}
    fewest = min(sum(1 for s in a_rows.values() if s.backend == b) for b in backends)
    monkeypatch.setattr(dataset, "MIN_SHARED", fewest)
    b = _rerun(sitting_a, tmp_path / "b.db", 4.0, jitter=1.21)
    merged = load_dataset([sitting_a, b])
    assert merged.merged == {"candidates": len(a_rows), "rows": 2 * len(a_rows), "by_shared": len(a_rows)}
    got = np.array([s.latency / a_rows[k].latency for k, s in _by_key(merged).items()])
    assert (got >= 1 / 1.1 - 1e-9).all() and (got <= 1.1 + 1e-9).all(), got  # raw: 2.0 and 2.2
    assert len(np.unique(got.round(9))) > 1  # the rerun's own part per row stays in the mean
    assert all(s.hw == a_rows[k].hw for k, s in _by_key(merged).items())  # run A's calibration carries it
    monkeypatch.setattr(dataset, "MIN_SHARED", fewest + 1)  # one backend short of shared rows: read raw
    short = load_dataset([sitting_a, b])
    assert 0 < short.merged["by_shared"] < len(a_rows)
    raw = [s.latency / a_rows[k].latency for k, s in _by_key(short).items() if s.latency / a_rows[k].latency > 1.5]
    assert len(raw) == len(a_rows) - short.merged["by_shared"]


def test_each_sitting_is_read_against_its_own_calibration(sitting_a, tmp_path, monkeypatch):
    """Too few shared candidates to scale by: the rerun's machine was 3x slower in everything, probes
    included, and read against its own calibration it agrees with run A, so the merged label is run A's."""
    monkeypatch.setattr(dataset, "MIN_SHARED", 10**6)
    a = tmp_path / "a.db"
    shutil.copy(sitting_a, a)
    _calibrate(a, 1.0)
    b = _rerun(sitting_a, tmp_path / "b.db", 3.0)
    _calibrate(b, 3.0)
    a_rows, merged = _by_key(load_dataset(a)), load_dataset([a, b])
    assert merged.merged["candidates"] == len(a_rows) and merged.merged["by_shared"] == 0
    got = np.array([s.latency / a_rows[k].latency for k, s in _by_key(merged).items()])
    assert got == pytest.approx(1.0, rel=0.02)  # raw, it would read sqrt(3) = 1.73
    assert all(s.hw == a_rows[k].hw for k, s in _by_key(merged).items())  # run A's calibration carries it


def test_other_machines_and_protocols_never_merge(sitting_a, tmp_path):
    b = _rerun(sitting_a, tmp_path / "b.db", 2.0)
    with closing(sqlite3.connect(b)) as c, c:
        c.execute("UPDATE measurements SET protocol = 'm4' WHERE id % 2 = 1")
    other = tmp_path / "other.db"
    assert _build_db(other, models=(("dcgan", "dcgan"),), fp="another-machine") > 20
    n_a = len(load_dataset(sitting_a))
    ds = load_dataset([sitting_a, b, other])
    n_m4 = sum(1 for s in load_dataset(b) if s.protocol == "m4")
    assert 0 < n_m4 < n_a
    assert ds.merged["candidates"] == n_a - n_m4 and len(ds) == n_a + n_m4 + n_a


def test_train_and_eval_say_what_they_merged(sitting_a, tmp_path, capsys):
    b = _rerun(sitting_a, tmp_path / "b.db", 2.0)
    n = len(load_dataset(sitting_a))
    art = tmp_path / "art"
    assert main(["train", "--db", str(sitting_a), "--db", str(b), "-o", str(art), *XGB_SMALL]) == 0
    out = capsys.readouterr().out
    assert f"trained xgb on {n} samples" in out
    assert f"{n} candidates were measured in more than one sitting ({2 * n} rows)" in out
    assert main(["eval", "--db", str(sitting_a), "--db", str(b), "--artifact", str(art), "--json"]) == 0
    import json

    r = json.loads(capsys.readouterr().out)
    assert r["n"] == n and r["merged_sittings"]["candidates"] == n and r["merged_sittings"]["rows"] == 2 * n
    assert r["db"] == f"{sitting_a} + {b}"
    assert main(["eval", "--db", str(sitting_a), "--db", str(b), "--artifact", str(art), "--sittings", "each",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2 * n
    with pytest.raises(SystemExit):
        main(["train", "--db", str(sitting_a), "-o", str(art), "--sittings", "avg"])
    assert "invalid choice: 'avg'" in capsys.readouterr().err


def test_one_database_given_twice_is_one_line(sitting_a, capsys):
    assert main(["eval", "--db", str(sitting_a), "--db", str(sitting_a), "--artifact", "default"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("collage-ml: error:") and "\n" not in err and "is given twice" in err, err
