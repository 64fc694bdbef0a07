"""``collect --ray``: one shard per node of a Ray cluster, each into a database on its node, merged into one."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from collage_ml.collector.summary import CollectSummary, print_summary
from collage_ml.db import default_db_path
from collage_ml.errors import CollageError, describe

RAY_MISSING = "--ray needs Ray, which is not installed: pip install 'collage-ml[ray]'"
#: how often Ray reruns a shard task whose worker process or node died; the rerun resumes the
#: shard's database, so it measures only what the dead attempt had not committed
RAY_TASK_RETRIES = 3
#: the environment a ``--ray local`` instance starts with when collage-ml imports Ray: no usage
#: reports, and every Ray address on loopback (Ray's single-machine mode, as on macOS)
RAY_LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _import_ray(address: str | None = None):
    import sys

    if address in ("local", "") and "ray" not in sys.modules:
        for k, v in RAY_LOCAL_ENV.items():  # read when Ray is imported
            os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError:
        raise CollageError(RAY_MISSING) from None
    return ray


def _ray_init(ray, address: str) -> None:
    """Connects to the cluster at ``address``, or starts a local instance (``"local"``) whose workers
    import this process's collage_ml (its source folder goes first on their PYTHONPATH)."""
    if address not in ("local", ""):
        ray.init(address=address, log_to_driver=False)
        return
    import collage_ml

    root = str(Path(collage_ml.__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    # address="local": a new instance, even when RAY_ADDRESS or a `ray start` on this machine names another
    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})


def ray_run_key(db_path: Any) -> str:
    """The name of the folder, under each node's ``<cache_dir()>/ray-shards/``, that holds the shard
    databases of a ``collect --ray`` into ``db_path``: a hash of this host and the database's absolute path.

    So a rerun into the same database (after a shard failed for good or the driver died) resumes from
    what the shards committed, and a collection into another database (another test session's) never
    sees them. A shard's files are removed once they are merged.
    """
    import socket

    where = f"{socket.gethostname()}|{Path(os.fspath(db_path)).resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def ray_shard_dir(run_key: str) -> Path:
    """This node's folder for the shard databases of run ``run_key`` (see :func:`ray_run_key`)."""
    return default_db_path().parent / "ray-shards" / run_key


def _shard_snapshot(path: Path, attempts: int = 5, timeout: float = 30.0) -> tuple[bytes, int]:
    """The bytes of a shard database holding everything committed, and its number of measurements.

    The WAL is checkpointed into the main file, and the checkpoint is checked: nothing held it back
    (``busy == 0``), every WAL frame was copied back, and the ``-wal`` file is empty while a write
    lock keeps writers out until the bytes are read. CollageError when that cannot be had within
    ``attempts`` tries (each waits up to ``timeout`` seconds for other connections).
    """
    import sqlite3

    wal = path.with_name(path.name + "-wal")
    why = "no attempt"
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        for attempt in range(attempts):
            if attempt:
                time.sleep(0.2 * attempt)
            busy, log, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy or log != copied:
                why = f"the WAL checkpoint was held back (busy={busy}, {copied} of {log} frames copied)"
                continue
            conn.execute("BEGIN IMMEDIATE")  # no writer until the bytes are read
            try:
                if wal.exists() and wal.stat().st_size:
                    why = f"{wal.name} is not empty after the checkpoint"  # a write came in between
                    continue
                rows = conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                return path.read_bytes(), int(rows)
            finally:
                conn.execute("ROLLBACK")
    finally:
        conn.close()
    raise CollageError(f"{path}: no consistent copy of the shard database after {attempts} attempts: {why}")


def _ray_node_task(threads: int | None) -> dict:
    """A Ray task run once on each node before the shards: where it ran, its hardware fingerprint, collage_ml."""
    import ray

    import collage_ml
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.measure.runner import default_threads

    return {
        "node": ray.get_runtime_context().get_node_id(), "hardware": fingerprint(threads or default_threads()),
        "version": collage_ml.__version__, "collage_ml": collage_ml.__file__,
    }


def _ray_shard_task(i: int, n: int, run_key: str, kwargs: dict, known: dict) -> dict:
    """One Ray task: collect shard ``i/n`` into this node's shard database; return a copy of it.

    The database, ``ray_shard_dir(run_key)/shard-<i>-of-<n>.db``, commits each measurement as it
    arrives and outlives the task: Ray's retry after the worker died, or a rerun after the driver
    died, resumes it. The driver removes it once merged. A dry run writes nothing (``data`` is empty).
    Returns ``summary`` (a dict), ``node`` (the Ray node id), ``path``, ``data`` and ``rows``.
    """
    import ray

    from collage_ml.collector.loop import collect  # the loop imports this module

    path = ray_shard_dir(run_key) / f"shard-{i}-of-{n}.db"
    s = collect(**kwargs, shard=(i, n), db=path, progress=False, _skip=known)
    out = {"summary": s.to_dict(), "node": ray.get_runtime_context().get_node_id(), "path": str(path),
           "data": b"", "rows": 0}
    if not kwargs.get("dry_run") and path.exists():
        out["data"], out["rows"] = _shard_snapshot(path)
    return out


def _ray_cleanup_task(paths: list[str]) -> int:
    """Removes merged shard databases (with their -wal and -shm files) and their folder once empty."""
    removed = 0
    for p in map(Path, paths):
        for f in (p, p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm")):
            try:
                f.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        try:
            p.parent.rmdir()
        except OSError:  # another shard of this run is still there
            pass
    return removed


def _merge_shard(database, tmp: Path, data: bytes, rows: int) -> None:
    """Writes a shard's bytes to ``tmp``, checks that the copy holds the ``rows`` the shard counted, merges it."""
    from collage_ml.db import Database

    tmp.write_bytes(data)
    with Database(tmp, create=False, readonly=True) as part:  # validates the copy
        got = part.count()
    if got != rows:
        raise CollageError(f"the copy of a shard database holds {got} measurements, the shard counted {rows}")
    database.merge(tmp)


def _summary_from_dict(d: Mapping[str, Any]) -> CollectSummary:
    names = set(CollectSummary.__dataclass_fields__)
    return CollectSummary(**{k: v for k, v in d.items() if k in names})


def _collect_ray(
    ray_address: str, *, db: Any, progress: bool, ray_shards: int | None, kwargs: dict,
    max_retries: int = RAY_TASK_RETRIES,
) -> CollectSummary:
    """Runs ``ray_shards`` shards (default: one per alive node with a CPU) as Ray tasks, each into a
    database on its node, and merges each into ``db`` as it finishes.

    The nodes must share one hardware fingerprint (measurements are per hardware; a shard split over
    two kinds of machine would leave both kinds half measured): CollageError otherwise, before any
    measurement. A shard that still fails after ``max_retries`` reruns raises CollageError once the
    others are merged; its committed rows stay on its node and the same command resumes them.
    ``dry_run`` writes nothing, neither ``db`` nor a shard database.
    """
    from collage_ml import __version__
    from collage_ml.db import Database

    ray = _import_ray(ray_address)
    t0 = time.monotonic()
    dry_run = bool(kwargs.get("dry_run"))
    own_db = not isinstance(db, Database)
    path = Path(os.fspath(db)) if own_db and db is not None else default_db_path() if own_db else db.path
    database = db if not own_db else Database(path, create=False, readonly=True) if path.exists() else None
    started = False
    try:
        if not ray.is_initialized():
            _ray_init(ray, ray_address)
            started = True
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as OnNode

        nodes = [nd for nd in ray.nodes() if nd.get("Alive") and nd.get("Resources", {}).get("CPU", 0) >= 1]
        if not nodes:
            raise CollageError(f"the Ray cluster at {ray_address!r} has no alive node with a CPU")
        probe = ray.remote(num_cpus=1)(_ray_node_task)
        infos = ray.get([
            probe.options(scheduling_strategy=OnNode(node_id=nd["NodeID"], soft=False)).remote(kwargs.get("threads"))
            for nd in nodes
        ])
        hardware = sorted({x["hardware"] for x in infos})
        if len(hardware) > 1:
            raise CollageError(
                f"the Ray cluster's nodes have {len(hardware)} hardware fingerprints ({', '.join(hardware)}); "
                "measurements are per hardware, so run one cluster per kind of machine, each into its own "
                "database, and `collage-ml db merge` them"
            )
        if stale := sorted({f"{x['version']} ({x['collage_ml']})" for x in infos if x["version"] != __version__}):
            raise CollageError(f"the Ray nodes run collage-ml {', '.join(stale)}; this driver runs {__version__}")
        if own_db and not dry_run:  # created only once the cluster passed (an existing one was checked above)
            if database is not None:
                database.close()
            database = Database(path)
        n = ray_shards or len(nodes)
        run_key = ray_run_key(path)
        # the driver's DB is the resume point: the shards skip what it holds for this hardware
        known_ref = ray.put({hardware[0]: sorted(database.known_keys(hardware[0]))} if database is not None else {})
        task = ray.remote(num_cpus=1, max_retries=max_retries)(_ray_shard_task)
        cleanup = ray.remote(num_cpus=0)(_ray_cleanup_task)
        shard_of_ref = {
            task.options(scheduling_strategy=OnNode(node_id=nodes[i % len(nodes)]["NodeID"], soft=True)).remote(
                i, n, run_key, kwargs, known_ref
            ): i
            for i in range(n)
        }
        parts: list[CollectSummary] = []
        failed: list[str] = []
        cleanups = []
        pending = list(shard_of_ref)
        with tempfile.TemporaryDirectory(prefix="collage-ml-ray-merge-") as tmp:
            while pending:  # merge each shard as it finishes
                (ref,), pending = ray.wait(pending, num_returns=1)
                i = shard_of_ref[ref]
                try:
                    r = ray.get(ref)
                except Exception as e:  # the task raised, or its worker or node died max_retries + 1 times
                    failed.append(f"shard {i}/{n}: {describe(e, 300)}")
                    continue
                parts.append(_summary_from_dict(r["summary"]))
                if r["data"]:
                    _merge_shard(database, Path(tmp) / f"shard-{i}.db", r["data"], r["rows"])
                    cleanups.append(
                        cleanup.options(scheduling_strategy=OnNode(node_id=r["node"], soft=False)).remote([r["path"]])
                    )
        for ref in cleanups:  # best effort: a node that died since keeps its files
            try:
                ray.get(ref, timeout=60)
            except Exception:
                pass
        if failed:
            raise CollageError(
                f"{len(failed)} of {n} Ray shards failed ({'; '.join(failed)}); the others are merged into "
                f"{path}; a failed shard's measurements stay on its node in <cache>/ray-shards/{run_key}, "
                "and running the same command again resumes them"
            )
        summary = CollectSummary.combine(parts, db=str(path), shard=None)
        summary.elapsed_s = time.monotonic() - t0
        if progress:
            print_summary(summary)
        return summary
    finally:
        if own_db and database is not None:
            database.close()
        if started:
            ray.shutdown()
