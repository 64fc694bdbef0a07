"""benchmarks/residuals.py: slices of leave-one-family-out errors, on a predictions file made here."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def res():
    return load_benchmark("residuals")


def _db(path: Path, rows: list[tuple[str, str, int]]) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE subgraphs (hash TEXT PRIMARY KEY, onnx BLOB, n_nodes INTEGER, ops TEXT)")
    con.executemany("INSERT INTO subgraphs (hash, onnx, n_nodes, ops) VALUES (?, x'', ?, ?)", rows)
    con.commit()
    con.close()
    return path


def _preds(path: Path) -> Path:
    # family a: two Conv rows predicted exactly; family b: two MatMul+Add rows predicted 2x too slow
    np.savez_compressed(path, **{
        "xgb/a/backend": np.array(["onnxruntime", "openvino"]), "xgb/a/hash": np.array(["c1", "c2"]),
        "xgb/a/true": np.array([5e-6, 2e-3]), "xgb/a/pred": np.array([5e-6, 2e-3]), "xgb/a/std": np.zeros(2),
        "xgb/b/backend": np.array(["onnxruntime", "onnxruntime"]), "xgb/b/hash": np.array(["m1", "zz"]),
        "xgb/b/true": np.array([50e-6, 50e-6]), "xgb/b/pred": np.array([100e-6, 100e-6]), "xgb/b/std": np.zeros(2),
    })
    return path


def test_slices_put_the_misses_where_they_are(res, tmp_path):
    db = _db(tmp_path / "m.db", [("c1", 1, "Conv"), ("c2", 2, "Conv,Relu"), ("m1", 2, "MatMul,Add")])
    rows = res.load_preds(_preds(tmp_path / "p.npz"), "xgb")
    out = res.slices(rows, res.subgraph_table([db]))
    assert out["all"]["all"]["n"] == 4 and out["all"]["all"]["within_10pct"] == 0.5
    assert out["family"]["a"]["within_10pct"] == 1.0 and out["family"]["b"]["within_10pct"] == 0.0
    assert out["family"]["b"]["of_misses"] == 1.0
    assert math.isclose(out["family"]["b"]["median_log_err"], math.log(2))  # predicted slower: positive
    assert out["op mix"]["Add+MatMul"]["n"] == 1 and out["op mix"]["?"]["n"] == 1  # "zz" is in no database
    assert out["latency"]["< 10 us"]["n"] == 1 and out["latency"]["30 us-100 us"]["within_10pct"] == 0.0
    assert out["nodes"]["unknown"]["n"] == 1 and out["nodes"]["2"]["n"] == 2
    assert out["backend"]["openvino"]["within_10pct"] == 1.0


def test_bad_inputs_are_one_line(res, tmp_path):
    p = _preds(tmp_path / "p.npz")
    with pytest.raises(SystemExit, match="no predictions of 'gnn' .it has xgb."):
        res.load_preds(p, "gnn")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(SystemExit, match="junk.npz: not a predictions file"):
        res.load_preds(tmp_path / "junk.npz", "xgb")
    with pytest.raises(SystemExit, match="nope.db: no such database"):
        res.subgraph_table([tmp_path / "nope.db"])
    np.savez_compressed(tmp_path / "old.npz", **{"xgb/a/true": np.ones(1), "xgb/a/pred": np.ones(1)})
    with pytest.raises(SystemExit, match="no subgraph hashes"):
        res.load_preds(tmp_path / "old.npz", "xgb")
