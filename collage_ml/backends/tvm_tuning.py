"""The ``tvm`` backend's MetaSchedule tuning and its persistent store of records.

Records live in a JSON database per target (CPU model and core count:
:func:`target_db_dir`) under the backend's ``db_dir``; ``collage_tasks.json``
beside it says which tasks were tuned with how many trials, so a task is tuned
once per target and budget (:func:`tune_and_apply`). Tuning across processes
is serialised by a file lock. :func:`run_tuning` is the MetaSchedule call
itself, with a search sized to the budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

#: file names inside a tuning database directory
_TASKS_FILE = "collage_tasks.json"
_LOCK_FILE = "tune.lock"

# -- MetaSchedule worker initializer ------------------------------------------------------------
# ``import tvm.s_tir.tensor_intrin`` registers every target's tensor intrinsics and takes 35 to 45 s
# (mostly CUDA), longer than LocalBuilder's timeout, so every trial fails ("LocalBuilder: Timeout").
# This initializer registers only the x86 ones (0.3 s) under a stub package. It is defined from
# source in a module that cannot be imported, so cloudpickle ships it to the workers by value and
# they need not import collage_ml.
_LIGHT_INIT_SRC = '''
def light_tensor_intrin():
    import importlib, importlib.util, sys, types
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import tvm.s_tir
    spec = importlib.util.find_spec(name)
    pkg = types.ModuleType(name)
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__package__ = name
    pkg.__file__ = spec.origin
    sys.modules[name] = pkg
    tvm.s_tir.tensor_intrin = pkg
    importlib.import_module(name + ".x86")
'''
_ns: dict = {"__name__": "_collage_ml_tvm_worker_init"}
exec(_LIGHT_INIT_SRC, _ns)  # noqa: S102 - a fixed, local source
light_tensor_intrin = _ns["light_tensor_intrin"]
del _ns


def target_db_dir(db_dir: Path, target) -> Path:
    """Records are kept per target (CPU model and core count) under ``db_dir``: a schedule tuned for 2 cores
    is not the best for 1."""
    d = dict(target.export()) if hasattr(target, "export") else {}
    cpu = str(d.get("mcpu", "cpu"))
    cores = d.get("num-cores", 0)
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:8]
    return db_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', cpu)}-c{cores}-{digest}"


def tune_and_apply(mod, target, trials: int, db_dir: Path, info: dict, tune: Callable[[object, Sequence, object], None]):
    """Tunes the tasks the database in ``db_dir`` lacks (for this budget) with ``tune(db, tasks, target)``,
    then applies the best records.

    ``collage_tasks.json`` beside the database says which tasks were tuned with how many
    trials, so a task is tuned once per target and budget. A task whose trials all failed
    (no valid record) is retried once on a later compile, then left untuned.
    """
    import tvm_ffi
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    light_tensor_intrin()  # the main process imports tensor_intrin too (TuneContext)
    tasks = ms.relax_integration.extract_tasks(mod, target)
    tasks = [t for t in tasks if not t.mod.attrs or not t.mod.attrs.get("tirx.is_scheduled", False)]
    info["tasks"] = len(tasks)
    if not tasks:
        return mod
    db_dir.mkdir(parents=True, exist_ok=True)
    # the key the JSON database itself looks workloads up by (stable across processes)
    keys = [f"{tvm_ffi.structural_hash(t.dispatched[0]) & 0xFFFFFFFFFFFFFFFF:016x}" for t in tasks]

    def settled(entry: dict) -> bool:
        return entry.get("trials", -1) >= trials and (entry.get("valid") or entry.get("attempts", 0) >= 2)

    with _file_lock(db_dir / _LOCK_FILE):
        done = _read_json(db_dir / _TASKS_FILE)
        todo = [(t, k) for t, k in zip(tasks, keys) if not settled(done.get(k, {}))]
        info["reused_tasks"] = len(tasks) - len(todo)
        db = ms.database.JSONDatabase(work_dir=str(db_dir), module_equality="structural")
        if todo:
            t0 = time.perf_counter()
            tune(db, [t for t, _ in todo], target)
            secs = time.perf_counter() - t0
            info["tuned_tasks"] = len(todo)
            info["seconds_per_task"] = secs / len(todo)
            done = _read_json(db_dir / _TASKS_FILE)
            for t, k in todo:
                old = done.get(k, {})
                done[k] = {
                    "task": t.task_name,
                    "trials": trials,
                    "valid": _has_record(db, t, target),
                    "attempts": old.get("attempts", 0) + 1 if old.get("trials") == trials else 1,
                    "seconds": round(secs / len(todo), 2),
                }
            _write_json(db_dir / _TASKS_FILE, done)
    info["applied_tasks"] = sum(_has_record(db, t, target) for t in tasks)
    if not info["applied_tasks"]:
        raise RuntimeError(f"no valid schedule among the records of {len(tasks)} task(s)")
    with target, db:
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    info["tuned"] = True
    return mod


def run_tuning(db, tasks: Sequence, target, trials: int) -> None:
    """MetaSchedule with ``trials`` trials per task over ``tasks``, its records committed to ``db``."""
    from tvm.s_tir import meta_schedule as ms

    ncores = max(1, int(os.environ.get("TVM_NUM_THREADS", "0")) or (os.cpu_count() or 1))
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    # the default evolutionary search samples a population of 512 before its first trial
    # (~20 s per task here); a budget of a few trials needs far fewer
    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=min(512, max(64, 32 * trials)),
        init_min_unmeasured=min(50, max(16, 4 * trials)),
        genetic_num_iters=4 if trials >= 16 else 2,
    )
    with tempfile.TemporaryDirectory(prefix="collage-tvm-tune-") as work_dir:
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            list(tasks), work_dir, strategy=strategy, num_threads=ncores, seed=0
        )
        if not contexts:
            return
        ms.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=work_dir,
            max_trials_global=trials * len(contexts),
            max_trials_per_task=trials,
            num_trials_per_iter=min(64, trials),
            builder=ms.builder.LocalBuilder(
                max_workers=ncores, timeout_sec=120.0, initializer=light_tensor_intrin
            ),
            runner=ms.runner.LocalRunner(
                timeout_sec=60.0,
                evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=50),
                initializer=light_tensor_intrin,
            ),
            database=db,
            cost_model="xgb",
        )


def _has_record(db, task, target) -> bool:
    try:
        return db.query_tuning_record(task.dispatched[0], target, task.task_name) is not None
    except Exception:
        return False


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock across processes (tuning appends to the JSON database files)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock
        yield
        return
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def tuning_records(db_dir: str | os.PathLike) -> int:
    """How many tuning records the JSON databases under ``db_dir`` hold (lines of the record files)."""
    n = 0
    for p in Path(db_dir).rglob("database_tuning_record.json"):
        with open(p) as f:
            n += sum(1 for line in f if line.strip())
    return n
