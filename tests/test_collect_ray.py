"""``collage-ml collect --ray`` against a real local Ray instance (skipped when Ray is not installed).

One Ray instance serves the module: started on loopback (``RAY_LOCAL_ENV``: no usage reports, Ray's
single-machine mode, so every address is 127.0.0.1) with 2 CPUs, and shut down at the end. Its
workers import collage_ml from this checkout (PYTHONPATH in the job's runtime_env). Shard databases
go to ``<COLLAGE_ML_CACHE>/ray-shards/<hash of the driver DB's path>``, so a second test session
(fresh tmp_path) starts from empty shards, and they are removed after each successful merge.
"""

from __future__ import annotations

import math
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest

from collage_ml.collector import RAY_LOCAL_ENV, RAY_MISSING, collect, plan, ray_run_key, ray_shard_dir
from collage_ml.collector.ray_fleet import _ray_node_task, _shard_snapshot
from collage_ml.db import Database
from collage_ml.errors import CollageError
from collage_ml.measure.timing import TimingConfig

from .test_collect import KW as _KW, PLAN_KW as _PLAN_KW, db_keys, db_rows

for _k, _v in RAY_LOCAL_ENV.items():  # before Ray is imported: Ray reads them then
    os.environ.setdefault(_k, _v)

REPO = Path(__file__).resolve().parents[1]
# dcgan-tiny on onnxruntime alone (14 candidates): torch's candidates would triple the time on 2 cores
KW = {**_KW, "backends": "onnxruntime"}
PLAN_KW = {**_PLAN_KW, "backends": "onnxruntime"}
# every candidate timed for ~0.5 s, so a kill lands mid-shard and both shards' workers overlap even where
# one starts seconds after the other (Ray starts a worker per task; with 0.25 s a shard might end first)
# pass_chunk=1: each candidate is committed as it is measured, so a kill can land between commits
SLOW = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                    warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=10**6, max_spread=0.0, time_cap=0.5,
                    pass_chunk=1)


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    try:
        assert [nd["NodeManagerAddress"] for nd in ray.nodes()] == ["127.0.0.1"]
        yield ray
    finally:
        ray.shutdown()


def _shard_rows(run_dir: Path, per_shard: list | None = None) -> dict[tuple[str, str, str], float]:
    """Every committed measurement in a run's shard databases (read while they are being written);
    ``per_shard`` gets each database's count."""
    out: dict = {}
    for f in sorted(run_dir.glob("shard-*.db")):
        n = len(out)
        try:
            conn = sqlite3.connect(f"file:{f}?mode=ro", uri=True, timeout=5)
            try:
                for h, b, v, ts in conn.execute(
                    "SELECT subgraph_hash, backend, backend_version, timestamp FROM measurements"
                ):
                    out[(h, b, v)] = ts
            finally:
                conn.close()
        except sqlite3.Error:  # not created yet
            pass
        if per_shard is not None:
            per_shard.append(len(out) - n)
    return out


def _shard_task_pids() -> list[int]:
    """Ray workers of this test process's Ray instance that are running a shard task."""
    me = os.getpid()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if not (d / "cmdline").read_bytes().startswith(b"ray::_ray_shard_task"):
                continue
            pid = int(d.name)
            while pid > 1:  # a descendant of this process (ray.init started the raylet)
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if pid == me:
                    pids.append(int(d.name))
                    break
        except (OSError, ValueError, IndexError):
            pass
    return pids


def test_ray_missing_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(CollageError, match=r"pip install 'collage-ml\[ray\]'") as e:
        collect(**KW, db=tmp_path / "x.db", ray_address="local")
    assert str(e.value) == RAY_MISSING and not (tmp_path / "x.db").exists()


def test_shard_snapshot_checks_the_wal_checkpoint(tmp_path):
    path = tmp_path / "shard.db"
    Database(path).close()
    w = sqlite3.connect(path, isolation_level=None)  # a WAL with frames the main file lacks
    w.execute("PRAGMA wal_autocheckpoint = 0")
    w.execute("INSERT INTO meta (key, value) VALUES ('note', 'in the WAL only')")
    assert (tmp_path / "shard.db-wal").stat().st_size > 0
    reader = sqlite3.connect(path, isolation_level=None)  # a read transaction holds the checkpoint back
    reader.execute("BEGIN")
    reader.execute("SELECT COUNT(*) FROM meta").fetchone()
    w.execute("INSERT INTO meta (key, value) VALUES ('note2', 'after the reader')")
    with pytest.raises(CollageError, match="no consistent copy.*held back"):
        _shard_snapshot(path, attempts=2, timeout=0.1)
    reader.execute("ROLLBACK")
    reader.close()
    data, rows = _shard_snapshot(path)
    assert rows == 0 and (tmp_path / "shard.db-wal").stat().st_size == 0  # truncated, while w still has it open
    w.close()
    copy = tmp_path / "copy.db"
    copy.write_bytes(data)  # the main file alone holds every commit
    with Database(copy, create=False, readonly=True) as db:
        assert db.count() == 0
    conn = sqlite3.connect(copy)
    assert conn.execute("SELECT value FROM meta WHERE key = 'note2'").fetchone() == ("after the reader",)
    conn.close()


def test_ray_shards_merge_to_the_unsharded_db_and_a_rerun_adds_nothing(ray_local, tmp_path):
    info = ray_local.get(ray_local.remote(_ray_node_task).remote(1))
    assert info["collage_ml"] == str(REPO / "collage_ml" / "__init__.py")  # workers run this checkout

    full, path = tmp_path / "full.db", tmp_path / "ray.db"
    ref = collect(**KW, db=full)
    s = collect(**KW, db=path, ray_address="local", ray_shards=2)
    assert s.stopped == "complete" and s.cache_hits == 0 and s.measured == ref.measured == plan(**PLAN_KW).planned
    assert s.valid == ref.valid and s.hardware == ref.hardware
    assert db_keys(path) == db_keys(full) == plan(**PLAN_KW).keys()
    with Database(path, create=False, readonly=True) as a, Database(full, create=False, readonly=True) as b:
        st, st_ref = a.stats(), b.stats()
        valid = {(m.key.subgraph_hash, m.key.backend, m.key.backend_version): m.valid for m in a.measurements()}
        valid_ref = {(m.key.subgraph_hash, m.key.backend, m.key.backend_version): m.valid for m in b.measurements()}
    for k in ("total", "subgraphs", "families", "backends", "hardware"):
        assert st[k] == st_ref[k]
    assert valid == valid_ref
    assert not ray_shard_dir(ray_run_key(path)).exists()  # merged shards are removed

    before = db_rows(path)
    again = collect(**KW, db=path, ray_address="local", ray_shards=2)
    assert again.stopped == "complete" and again.measured == 0 and again.cache_hits == s.measured
    assert db_rows(path) == before
    assert not ray_shard_dir(ray_run_key(path)).exists()


def test_ray_dry_run_writes_nothing(ray_local, tmp_path):
    path = tmp_path / "dry.db"
    total = plan(**PLAN_KW).planned
    s = collect(**KW, db=path, ray_address="local", ray_shards=2, dry_run=True)
    assert s.stopped == "dry-run" and s.planned == total and s.measured == 0
    assert not path.exists() and not ray_shard_dir(ray_run_key(path)).exists()
    assert list(tmp_path.iterdir()) == []

    collect(**KW, db=path, max_candidates=3)  # a partial database, then a dry run against it
    data, rows = path.read_bytes(), db_rows(path)
    s = collect(**KW, db=path, ray_address="local", ray_shards=2, dry_run=True)
    assert s.planned == total - 3 and s.cache_hits == 3 and s.measured == 0
    assert path.read_bytes() == data and db_rows(path) == rows
    assert not ray_shard_dir(ray_run_key(path)).exists()


def _kill_one_shard_worker(path: Path, retries: int | None):
    """Runs ``collect --ray`` (2 shards, slow timing) in a thread and SIGKILLs one shard's Ray worker once
    each shard has committed 2 rows. Returns (rows committed before the kill, the summary or the error)."""
    result: dict = {}

    def run():
        try:
            result["summary"] = collect(**{**KW, "timing": SLOW}, db=path, ray_address="local", ray_shards=2,
                                        ray_retries=retries)
        except BaseException as e:  # noqa: BLE001  (re-raised or checked by the test)
            result["error"] = e

    run_dir = ray_shard_dir(ray_run_key(path))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    pids: list[int] = []
    counts: list[int] = []
    while True:
        # the state seen last goes into the message: a shard that ends before the other starts is the way
        # this can fail on a loaded machine (each shard is ~7 candidates of SLOW's time_cap)
        seen = f"shard workers running {len(pids)}, rows committed per shard {counts}"
        assert t.is_alive(), f"the collection ended before the kill ({seen}): {result}"
        assert time.monotonic() < deadline, f"the shards did not commit 2 measurements each within 60 s ({seen})"
        pids, counts = _shard_task_pids(), []
        _shard_rows(run_dir, counts)
        if len(pids) == 2 and len(counts) == 2 and min(counts) >= 2:
            break
        time.sleep(0.05)
    before = _shard_rows(run_dir)  # committed before the kill
    os.kill(pids[0], signal.SIGKILL)
    t.join(120)
    assert not t.is_alive(), "collect --ray did not return within 120 s of the kill"
    return before, result


def test_ray_worker_sigkill_mid_shard_is_retried_and_loses_nothing(ray_local, tmp_path):
    path = tmp_path / "killed.db"
    total = plan(**PLAN_KW).keys()
    before, result = _kill_one_shard_worker(path, retries=None)
    s = result.get("summary")
    assert s is not None, f"collect --ray failed: {result.get('error')!r}"
    # Ray reran the killed shard, which resumed its database: its first attempt's rows are cache hits
    assert s.stopped == "complete" and s.cache_hits > 0 and s.measured + s.cache_hits == len(total)
    after = db_rows(path)
    assert set(after) == total
    assert all(after.get(k) == ts for k, ts in before.items())  # no committed row lost or rewritten
    assert not ray_shard_dir(ray_run_key(path)).exists()
    again = collect(**KW, db=path, ray_address="local", ray_shards=2)
    assert again.measured == 0 and again.cache_hits == len(total) and db_rows(path) == after


def test_ray_shard_that_fails_for_good_is_resumed_by_the_rerun(ray_local, tmp_path):
    path = tmp_path / "failed.db"
    total = plan(**PLAN_KW).keys()
    before, result = _kill_one_shard_worker(path, retries=0)
    e = result.get("error")
    assert isinstance(e, CollageError) and "1 of 2 Ray shards failed" in str(e), result
    merged = db_rows(path)  # the other shard
    left = _shard_rows(ray_shard_dir(ray_run_key(path)))  # the failed shard's committed rows, kept on the node
    assert merged and left and not set(merged) & set(left) and set(before) <= set(merged) | set(left)

    s = collect(**KW, db=path, ray_address="local", ray_shards=2)
    assert s.stopped == "complete" and s.cache_hits == len(merged) + len(left)
    assert s.measured == len(total) - len(merged) - len(left)
    after = db_rows(path)
    assert set(after) == total
    assert all(after.get(k) == ts for k, ts in {**before, **merged, **left}.items())
    assert not ray_shard_dir(ray_run_key(path)).exists()


def test_every_shard_calibrates_its_node_and_the_merge_keeps_each_calibration(ray_local, tmp_path):
    from collage_ml.measure.hardware import node_id
    from collage_ml.measure.probes import PROBE_SET_VERSION, probe_names

    path = tmp_path / "ray.db"
    s = collect(**{**KW, "recalibrate_hours": 1.0}, db=path, ray_address="local", ray_shards=2)
    assert s.stopped == "complete" and s.calibrations == 2 and s.measured == plan(**PLAN_KW).planned
    with Database(path, create=False, readonly=True) as db:
        cals = db.calibrations(s.hardware, PROBE_SET_VERSION)
        rows = list(db.measurements())
    # one node here, so one first calibration and the other shard's as a later sitting, both whole
    assert sorted(c.sitting is None for c in cals) == [False, True]
    assert all(c.backend == "onnxruntime" and set(c.values) == set(probe_names()) for c in cals)
    # the merge keeps which node measured each calibration and each row (the machine that ran the shards)
    assert {c.node for c in cals} == {m.extra.get("node") for m in rows} == {node_id()}
