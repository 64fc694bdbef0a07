"""The measurement store: round trips, no overwrite, no loss under kill -9 and concurrency, merge, refusals."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collage_ml.cost import CandidateKey, Measurement
from collage_ml.db import APPLICATION_ID, MAGIC, SCHEMA_VERSION, Database
from collage_ml.errors import CollageError, DatabaseError

from .helpers import chain_model

ROOT = Path(__file__).resolve().parents[1]
HW = "cpu-test-t2-000000000000"


def valid_m(h="h0", backend="onnxruntime", version="1.32.0", hw=HW, **kw) -> Measurement:
    d = dict(
        samples=[1.0e-3, 1.1e-3, 0.9e-3],
        median=1.0e-3,
        spread=0.1,
        compile_seconds=0.25,
        max_abs_error=1e-6,
        max_rel_error=2e-5,
        threads=2,
        versions={"onnxruntime": "1.32.0", "numpy": "2.1"},
        family="resnet",
        extra={"flops": 12345, "nested": {"a": [1, 2]}},
    )
    d.update(kw)
    return Measurement(CandidateKey(h, backend, version), hw, True, **d)


def invalid_m(h="h1", backend="tvm", version="0.27", hw=HW, **kw) -> Measurement:
    d = dict(threads=2, versions={"tvm": "0.27"}, family="bert", error_text="TVMError: no schedule for op Gather")
    d.update(kw)
    return Measurement(CandidateKey(h, backend, version), hw, False, **d)


def fields(m: Measurement) -> dict:
    d = m.to_dict()
    return d


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "m.db") as d:
        yield d


# ----------------------------------------------------------------------------- round trips


def test_round_trip_valid_and_invalid(tmp_path):
    path = tmp_path / "m.db"
    a, b = valid_m(), invalid_m()
    with Database(path) as d:
        assert d.commit(a) is True
        assert d.commit(b) is True
    with Database(path, create=False) as d:  # reopened from disk
        ga = d.get(a.key, HW)
        gb = d.get(b.key, HW)
        assert ga is not None and gb is not None
        assert fields(ga) == fields(a)
        assert fields(gb) == fields(b)
        assert ga.cost.is_value and ga.cost.seconds == pytest.approx(1.0e-3)
        assert gb.cost.is_invalid and not gb.valid
        assert gb.error_text == "TVMError: no schedule for op Gather"
        assert d.has(a.key, HW) and not d.has(a.key, "other-hw")
        assert d.get(a.key, "other-hw") is None
        assert d.get(CandidateKey("h0", "onnxruntime", "9.9"), HW) is None  # version is part of the key
        assert d.known_keys(HW) == {("h0", "onnxruntime", "1.32.0"), ("h1", "tvm", "0.27")}
        assert d.known_keys("other-hw") == set()


def test_numpy_values_and_odd_extra_are_stored(db):
    np = pytest.importorskip("numpy")
    m = valid_m(
        samples=list(np.array([1e-3, 2e-3], dtype=np.float32)),
        median=np.float32(1.5e-3),
        threads=np.int64(2),
        extra={"shape": np.array([1, 3]), "n": np.int32(4), "obj": object()},
    )
    assert db.commit(m)
    g = db.get(m.key, HW)
    assert g.median == pytest.approx(1.5e-3) and isinstance(g.median, float)
    assert g.extra["shape"] == [1, 3] and g.extra["n"] == 4 and isinstance(g.extra["obj"], str)


def test_bad_keys_are_rejected(db):
    with pytest.raises(ValueError):
        db.commit(valid_m(h=""))
    with pytest.raises(ValueError):
        db.commit(valid_m(hw=""))
    assert len(db) == 0


def test_boundary_rows(db):
    """A boundary cost in the old shape of a candidate row is stored as a boundary cost, not a candidate
    (tests/test_records.py covers the boundaries table)."""
    from collage_ml.measure.records import BoundaryKey

    m = valid_m(h="boundary:4096", backend="onnxruntime->torch", version="1.32.0|2.13.0", samples=[1.3e-3], median=1.3e-3)
    assert db.commit(m)
    assert db.get(CandidateKey("boundary:4096", "onnxruntime->torch", "1.32.0|2.13.0"), HW) is None
    b = db.get_boundary(BoundaryKey("onnxruntime", "1.32.0", "torch", "2.13.0", 4096, "float32[1,1024]"), HW)
    assert b is not None and b.median == pytest.approx(1.3e-3)
    assert db.subgraph_onnx("boundary:4096") is None
    assert len(db) == 0 and not list(db.measurements(backend="onnxruntime->torch"))


def test_onnx_bytes_stored_once(db):
    data = chain_model().SerializeToString()
    assert db.commit(valid_m(h="sg", backend="onnxruntime", onnx_bytes=data))
    assert db.commit(valid_m(h="sg", backend="tvm", onnx_bytes=b"not stored again"))
    assert db.subgraph_onnx("sg") == data
    assert db.subgraph_onnx("nope") is None
    n_nodes, ops = db._conn.execute("SELECT n_nodes, ops FROM subgraphs WHERE hash = 'sg'").fetchone()
    assert n_nodes == 6 and ops == "MatMul,Relu,Add,Sigmoid,Tanh,Mul"
    assert db.get(CandidateKey("sg", "tvm", "1.32.0"), HW).onnx_bytes is None  # blobs are loaded on demand


def test_insert_or_ignore_never_overwrites(db):
    first = valid_m(median=1e-3, samples=[1e-3])
    assert db.commit(first) is True
    again = valid_m(median=5e-3, samples=[5e-3], family="other")
    assert db.commit(again) is False
    bad = invalid_m(h="h0", backend="onnxruntime", version="1.32.0")
    assert db.commit(bad) is False
    g = db.get(first.key, HW)
    assert g.median == pytest.approx(1e-3) and g.valid and g.family == "resnet"
    assert len(db) == 1
    # the same key on another machine is a different row
    assert db.commit(valid_m(hw="cpu-other-t2-111111111111")) is True
    # commit_many counts only the new ones, keeps the old
    assert db.commit_many([valid_m(median=9.0), valid_m(h="h9"), valid_m(h="h9")]) == 1
    assert db.get(first.key, HW).median == pytest.approx(1e-3)
    assert len(db) == 3


def test_commit_many_is_one_transaction(db):
    ms = [valid_m(h=f"x{i}") for i in range(5)] + [valid_m(h="")]
    with pytest.raises(ValueError):
        db.commit_many(ms)
    assert len(db) == 0
    assert db.commit_many(ms[:5]) == 5


def test_measurements_filters_and_stats(db):
    db.register_hardware(HW, {"cpu_model": "test", "threads": 2})
    assert db.register_hardware(HW, {"cpu_model": "changed"}) is False
    assert db.hardware_info(HW) == {"cpu_model": "test", "threads": 2}
    ms = [valid_m(h=f"v{i}", backend="onnxruntime", family="resnet") for i in range(4)]
    ms += [valid_m(h=f"t{i}", backend="tvm", family="bert") for i in range(3)]
    ms += [invalid_m(h=f"i{i}", backend="tvm", family="bert") for i in range(2)]
    ms += [valid_m(h="o0", hw="cpu-other-t4-222222222222", family="resnet")]
    ms[0].extra = {"contended": True, "retimed": 2}
    ms[1].extra = {"contended": False, "retimed": 1}
    ms[7].extra = {"contended": True}  # an invalid row is not counted as a contended timing
    assert db.commit_many(ms) == 10
    assert [m.key.subgraph_hash for m in db.measurements(backend="tvm", valid=True)] == ["t0", "t1", "t2"]
    assert len(list(db.measurements(valid=False))) == 2
    assert len(list(db.measurements(family="resnet"))) == 5
    assert len(list(db.measurements(hardware=HW))) == 9
    assert len(list(db.measurements())) == 10
    s = db.stats()
    assert s["valid"] == 8 and s["invalid"] == 2 and s["total"] == 10
    assert s["contended"] == 1 and s["retimed"] == 2
    assert s["backends"] == {"onnxruntime": 5, "tvm": 5}
    assert s["families"] == {"bert": 5, "resnet": 5}
    assert s["hardware"] == {HW: 9, "cpu-other-t4-222222222222": 1}
    s = db.stats(hardware=HW)
    assert s["valid"] == 7 and s["invalid"] == 2 and s["hardware"] == {HW: 9}
    assert db.stats(hardware="none") == {
        "total": 0,
        "valid": 0,
        "invalid": 0,
        "failed": 0,
        "contended": 0,
        "retimed": 0,
        "subgraphs": 0,
        "onnx_stored": 0,
        "backends": {},
        "families": {},
        "hardware": {},
        "protocols": {},
        "calibrations": {},
        "boundaries": 0,
        "boundaries_valid": 0,
        "plan_timings": 0,
        "plan_timings_valid": 0,
    }


def test_measurements_streams_pages_and_tolerates_commits(db, monkeypatch):
    monkeypatch.setattr("collage_ml.db.measurements._PAGE", 7)
    db.commit_many([valid_m(h=f"p{i:03d}") for i in range(30)])
    seen = []
    for m in db.measurements():
        seen.append(m.key.subgraph_hash)
        if len(seen) == 3:
            db.commit(valid_m(h="late"))  # writing while iterating must work
    assert seen[:30] == [f"p{i:03d}" for i in range(30)] and seen[30:] == ["late"]


# ----------------------------------------------------------------------------- crash safety and concurrency

WRITER = textwrap.dedent(
    """
    import sys
    from collage_ml.cost import CandidateKey, Measurement
    from collage_ml.db import Database

    path, tag, n, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    db = Database(path, timeout=timeout)
    if len(sys.argv) > 5:  # say "locked" once the first write has been refused and is being retried
        import threading, time

        def announce():
            while db.retries == 0:
                time.sleep(0.002)
            print("locked", flush=True)

        threading.Thread(target=announce, daemon=True).start()
    print("ready", flush=True)
    i = 0
    while n < 0 or i < n:
        if i % 10 < 5:  # single commits, then batches of five
            m = Measurement(CandidateKey(f"{tag}-{i}", "b", "1"), "hw", True, samples=[1e-3], median=1e-3,
                            onnx_bytes=b"x" * 2000 if i % 3 == 0 else None)
            db.commit(m)
            print(i, flush=True)
            i += 1
        else:
            batch = [Measurement(CandidateKey(f"{tag}-{j}", "b", "1"), "hw", j % 2 == 0, samples=[1e-3],
                                 median=1e-3) for j in range(i, i + 5)]
            db.commit_many(batch)
            for j in range(i, i + 5):
                print(j, flush=True)
            i += 5
        if i % 40 == 0:
            db.commit(Measurement(CandidateKey("shared", "b", "1"), "hw", True, samples=[1e-3], median=1e-3))
    print("retries", db.retries, file=sys.stderr)
    db.close()
    """
)


def _spawn(path, tag, n, timeout=30.0, announce=False):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), tag, str(n), str(timeout)] + (["announce"] if announce else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def test_kill_9_loses_nothing_committed(tmp_path):
    path = tmp_path / "k.db"
    p = _spawn(path, "k", -1)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        printed = []
        deadline = time.monotonic() + 15
        while len(printed) < 73 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            printed.append(int(line))
        os.kill(p.pid, signal.SIGKILL)
        rest, _ = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    printed += [int(x) for x in rest.split()]
    assert p.returncode == -signal.SIGKILL
    assert len(printed) >= 73
    with Database(path, create=False) as d:  # must open: not corrupt
        assert d._conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored = {m.key.subgraph_hash for m in d.measurements()}
        missing = {f"k-{i}" for i in printed} - stored
        assert not missing
        assert d.subgraph_onnx("k-0") == b"x" * 2000


def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "c.db"
    n = 300
    Database(path).close()
    # "b" barely waits for the lock, and the test holds the write lock while both start, so b's writes
    # must go through the retry path
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    procs = [_spawn(path, "a", n), _spawn(path, "b", n, timeout=0.001, announce=True)]
    for p in procs:  # opening an existing database writes nothing, so both get this far under the lock
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    # hold the lock until b says its first write was refused (no fixed sleep: a loaded machine may take
    # seconds to get there; b itself gives up after DEFAULT_RETRY_S, and then readline returns "")
    line = procs[1].stdout.readline().strip()
    assert line == "locked", (line, procs[1].stderr.read() if not line else "")
    lock.execute("COMMIT")
    lock.close()
    outs, retries = [], []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out)
        retries.append(int(err.split("retries")[-1].split()[0]))
    assert retries[1] > 0, retries  # b was locked out at first and retried
    with Database(path, create=False) as d:
        stored = {m.key.subgraph_hash for m in d.measurements()}
        assert d._conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert len(d) == 2 * n + 1  # plus the one key both wrote
    for tag, out in zip(("a", "b"), outs):
        ids = [int(x) for x in out.split()]  # "ready" (and b's "locked") were read above
        assert sorted(ids) == list(range(n))
        assert {f"{tag}-{i}" for i in ids} <= stored
    assert "shared" in stored


def test_threads_share_one_database(db):
    import threading

    errors = []

    def work(t):
        try:
            for i in range(40):
                assert db.commit(valid_m(h=f"t{t}-{i}"))
                assert db.has(valid_m(h=f"t{t}-{i}").key, HW)
                assert len(list(db.measurements(backend="onnxruntime"))) >= i
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(db) == 160


def test_odd_path_characters(tmp_path):
    path = tmp_path / "we?ird #dir %20" / "m db?.sqlite"
    with Database(path) as d:
        d.commit(valid_m())
    assert path.exists()
    with Database(path) as d, Database(tmp_path / "other.db") as o:
        assert o.merge(path) == 1


# ----------------------------------------------------------------------------- merge


def test_merge_union_idempotent_carries_onnx_and_hardware(tmp_path):
    onnx_a = chain_model(seed=1).SerializeToString()
    with Database(tmp_path / "a.db") as a:
        a.register_hardware(HW, {"who": "a"})
        a.commit(valid_m(h="s1", onnx_bytes=onnx_a))
        a.commit(valid_m(h="s2", median=2e-3))
        a.commit(invalid_m(h="s3"))
    with Database(tmp_path / "b.db") as b:
        b.register_hardware(HW, {"who": "b"})
        b.register_hardware("cpu-b-t2-333333333333", {"who": "b2"})
        b.commit(valid_m(h="s2", median=7e-3))  # overlaps a's key: a's row wins in a
        b.commit(valid_m(h="s4", onnx_bytes=b"onnx-of-s4"))
        b.commit(valid_m(h="s1", hw="cpu-b-t2-333333333333"))
    before_b = (tmp_path / "b.db").read_bytes()
    with Database(tmp_path / "a.db") as a:
        assert a.merge(tmp_path / "b.db") == 2
        assert a.merge(tmp_path / "b.db") == 0
        assert a.merge(tmp_path / "a.db") == 0
        keys = {(m.key.subgraph_hash, m.hardware) for m in a.measurements()}
        assert keys == {("s1", HW), ("s2", HW), ("s3", HW), ("s4", HW), ("s1", "cpu-b-t2-333333333333")}
        assert a.get(valid_m(h="s2").key, HW).median == pytest.approx(2e-3)
        assert a.subgraph_onnx("s1") == onnx_a
        assert a.subgraph_onnx("s4") == b"onnx-of-s4"
        assert a.hardware_info(HW) == {"who": "a"}
        assert a.hardware_info("cpu-b-t2-333333333333") == {"who": "b2"}
    assert (tmp_path / "b.db").read_bytes() == before_b
    # merging the other way round gives the same key set
    with Database(tmp_path / "b.db") as b:
        assert b.merge(tmp_path / "a.db") == 2
        assert len(b) == 5


def test_merge_refuses_foreign_and_corrupt(tmp_path, db):
    db.commit(valid_m())
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    with pytest.raises(DatabaseError, match="junk.db"):
        db.merge(junk)
    foreign = _foreign_db(tmp_path / "foreign.db")
    with pytest.raises(DatabaseError, match="another application"):
        db.merge(foreign)
    with pytest.raises(DatabaseError, match="no such"):
        db.merge(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    assert len(db) == 1


# ----------------------------------------------------------------------------- refusing bad files


def _foreign_db(path: Path) -> Path:
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    c.execute("INSERT INTO users (name) VALUES ('alice')")
    c.commit()
    c.close()
    return path


def test_random_bytes_refused(tmp_path):
    path = tmp_path / "random.db"
    data = os.urandom(10000)
    path.write_bytes(data)
    with pytest.raises(DatabaseError) as e:
        Database(path)
    msg = str(e.value)
    assert str(path) in msg and "not an SQLite file" in msg and "\n" not in msg
    assert path.read_bytes() == data


def test_memory_name_refused_without_a_file(tmp_path, monkeypatch):
    # sqlite's ":memory:" would otherwise become a file of that name in the working folder
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseError) as e:
        Database(":memory:")
    msg = str(e.value)
    assert "in-memory database is not supported" in msg and "\n" not in msg
    assert list(tmp_path.iterdir()) == []


def test_foreign_sqlite_refused_and_unchanged(tmp_path):
    path = _foreign_db(tmp_path / "foreign.db")
    before = path.read_bytes()
    for kw in ({}, {"create": False}, {"readonly": True}):
        with pytest.raises(DatabaseError) as e:
            Database(path, **kw)
        msg = str(e.value)
        assert str(path) in msg and "another application" in msg and "users" in msg and "\n" not in msg
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.db"]


def test_foreign_application_id_refused(tmp_path):
    path = tmp_path / "app.db"
    c = sqlite3.connect(path)
    c.execute("PRAGMA application_id = 1234")
    c.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    c.commit()
    c.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="another application"):
        Database(path)
    assert path.read_bytes() == before


def test_truncated_db_refused(tmp_path):
    path = tmp_path / "t.db"
    with Database(path) as d:
        d.commit_many([valid_m(h=f"t{i}", extra={"pad": "x" * 500}) for i in range(400)])
    assert not Path(str(path) + "-wal").exists()  # checkpointed on close
    data = path.read_bytes()
    assert len(data) > 100_000
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatabaseError) as e:
        Database(path)
    assert str(path) in str(e.value) and "corrupt or truncated" in str(e.value)
    path.write_bytes(data[:60])  # not even a whole header
    with pytest.raises(DatabaseError, match="truncated"):
        Database(path)


def test_corrupt_page_refused(tmp_path):
    path = tmp_path / "p.db"
    with Database(path) as d:
        d.commit_many([valid_m(h=f"t{i}", extra={"pad": "x" * 500}) for i in range(400)])
    data = bytearray(path.read_bytes())
    page = 4096 * (len(data) // 4096 // 2)
    data[page + 8 : page + 4096] = random.Random(0).randbytes(4088)  # the page header stays, its cells are garbage
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseError) as e:
        Database(path)
    msg = str(e.value)
    assert str(path) in msg and "corrupt or truncated (quick_check" in msg and "\n" not in msg
    assert path.read_bytes() == bytes(data)


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "new.db"
    Database(path).close()
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    c.commit()
    c.close()
    with pytest.raises(DatabaseError, match="newer collage-ml"):
        Database(path)


def test_file_identifies_itself(tmp_path):
    path = tmp_path / "id.db"
    Database(path).close()
    header = path.read_bytes()[:100]
    assert int.from_bytes(header[68:72], "big") == APPLICATION_ID
    c = sqlite3.connect(path)
    assert c.execute("SELECT value FROM meta WHERE key = 'magic'").fetchone() == (MAGIC,)
    assert c.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert c.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    c.close()


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatabaseError, match="no such"):
        Database(tmp_path / "absent.db", create=False)
    assert not (tmp_path / "absent.db").exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(DatabaseError, match="empty"):
        Database(empty, create=False)
    with Database(empty) as d:  # an empty file becomes a database
        assert d.commit(valid_m())
    with Database(tmp_path / "sub" / "dir" / "x.db") as d:
        assert len(d) == 0
    with pytest.raises(DatabaseError, match="directory"):
        Database(tmp_path)


def test_readonly_and_closed(tmp_path):
    path = tmp_path / "ro.db"
    with Database(path) as d:
        d.commit(valid_m())
    with Database(path, readonly=True) as d:
        assert d.get(valid_m().key, HW) is not None
        with pytest.raises(DatabaseError, match="read-only"):
            d.commit(valid_m(h="new"))
    d = Database(path)
    d.close()
    d.close()
    with pytest.raises(DatabaseError, match="closed"):
        d.get(valid_m().key, HW)


# ----------------------------------------------------------------------------- export


def test_export_parquet(tmp_path, db):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (the missing-pyarrow error is tested below)")
    db.commit(valid_m(h="a"))
    db.commit(invalid_m(h="b"))
    db.commit(valid_m(h="c", hw="cpu-other-t2-444444444444"))
    out = tmp_path / "out" / "m.parquet"
    assert db.export_parquet(out) == 3
    t = pq.read_table(out)
    rows = t.to_pylist()
    assert [r["subgraph_hash"] for r in rows] == ["a", "b", "c"]
    assert [r["valid"] for r in rows] == [True, False, True]
    import json

    assert json.loads(rows[0]["samples"]) == [1.0e-3, 1.1e-3, 0.9e-3]
    assert json.loads(rows[0]["versions"]) == {"onnxruntime": "1.32.0", "numpy": "2.1"}
    assert json.loads(rows[0]["extra"])["nested"] == {"a": [1, 2]}
    assert rows[1]["median"] is None and rows[1]["error_text"].startswith("TVMError")
    assert db.export_parquet(out, hardware=HW) == 2
    assert pq.read_table(out).num_rows == 2
    assert [p.name for p in out.parent.iterdir()] == ["m.parquet"]  # no temp files left


def test_export_parquet_without_pyarrow(tmp_path, db, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    db.commit(valid_m())
    with pytest.raises(CollageError, match="pip install pyarrow"):
        db.export_parquet(tmp_path / "m.parquet")
    assert not (tmp_path / "m.parquet").exists()


def test_a_contended_timing_is_measured_again_and_kept(db):
    """A valid row timed under contention is not settled: a later clean timing replaces it (the contended one is
    kept in ``extra["earlier"]``), a later failure only counts the attempt, and after MAX_ATTEMPTS it is settled."""
    from collage_ml.cost import MAX_ATTEMPTS

    key = CandidateKey("c" * 40, "onnxruntime", "1.0")

    def m(median, contended=False, failed=False):
        valid = not failed
        return Measurement(key, "hw", valid, [median] if valid else [], median if valid else None, 0.01,
                           failed=failed, error_text="timeout: 1 s" if failed else "",
                           extra={"contended": contended, "cpu_pressure": 0.4 if contended else 0.0})

    assert db.commit(m(2e-3, contended=True))
    got = db.get(key, "hw")
    assert got.contended and got.retryable and db.known_keys("hw") == set()
    assert db.commit(m(0, failed=True))  # a failure after it: the timing stays, the attempt counts
    got = db.get(key, "hw")
    assert got.valid and got.median == 2e-3 and got.attempts == 2
    assert db.commit(m(1e-3))  # clean: replaces it, and remembers the contended one
    got = db.get(key, "hw")
    assert got.median == 1e-3 and not got.contended and not got.retryable and got.attempts == 3
    assert got.extra["earlier"][0]["median"] == 2e-3 and got.extra["earlier"][0]["contended"]
    assert db.known_keys("hw") == {(key.subgraph_hash, key.backend, key.backend_version)}
    assert not db.commit(m(5e-4))  # a clean row is never overwritten
    # a row contended on every attempt is settled after MAX_ATTEMPTS
    k2 = CandidateKey("d" * 40, "onnxruntime", "1.0")
    for _ in range(MAX_ATTEMPTS):
        db.commit(dataclasses.replace(m(3e-3, contended=True), key=k2))
    assert db.get(k2, "hw").attempts == MAX_ATTEMPTS and not db.get(k2, "hw").retryable
    assert not db.commit(dataclasses.replace(m(1e-3), key=k2))
