"""The collection loop: :func:`collect` plans, then measures the plan through the tuner's measure step."""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from collage_ml.collector.planning import DEFAULT_MAX_REFERENCE_BYTES, CollectPlan, _Work, plan, plan_lazily
from collage_ml.collector.ray_fleet import RAY_TASK_RETRIES, _collect_ray
from collage_ml.collector.samplers import DEFAULT_SAMPLES_PER_GRAPH, FOCUS_NEEDS_MODEL, _check_sampler, _load_cost_model
from collage_ml.collector.sharding import DEFAULT_INDUCTOR_FRACTION, _key_tuple, parse_shard
from collage_ml.collector.sources import _import, parse_batch_sizes, resolve_models
from collage_ml.collector.summary import CollectSummary, _new_backend_counts, print_summary
from collage_ml.db import default_db_path
from collage_ml.defaults import MAX_REGION_SIZE, RECALIBRATE_HOURS
from collage_ml.errors import CollageError, describe
from collage_ml.ui import Bar

#: the clock budgets are measured with (tests replace it)
_clock = time.monotonic


def collect(
    models: str | Sequence[str] = "all",
    backends: Any = None,
    db: Any = None,
    budget_minutes: float | None = None,
    max_candidates: int | None = None,
    sampler: str = "enumerate",
    shard: Any = None,
    seed: int = 0,
    threads: int | None = None,
    max_region_size: int = MAX_REGION_SIZE,
    batch_sizes: Any = None,
    progress: bool = True,
    ray_address: str | None = None,
    *,
    cost_model: Any = None,
    inductor_fraction: float = DEFAULT_INDUCTOR_FRACTION,
    samples_per_graph: int = DEFAULT_SAMPLES_PER_GRAPH,
    timing: Any = None,
    timeout: float = 120.0,
    max_reference_bytes: int = DEFAULT_MAX_REFERENCE_BYTES,
    dry_run: bool = False,
    on_measurement: Callable[[Any], None] | None = None,
    ray_shards: int | None = None,
    ray_retries: int | None = None,
    recalibrate_hours: float | None = RECALIBRATE_HOURS,
    _skip: Mapping[str, Iterable[tuple[str, str, str]]] | None = None,
) -> CollectSummary:
    """Measures candidates of ``models`` on ``backends`` into ``db``; resumable, shardable, budgeted.

    - ``models``: zoo names and ONNX paths (a list or ``"a,b"``); ``"all"`` is every full-size
      zoo model, ``"tiny"`` every ``-tiny`` one.
    - ``backends``: names (a list or ``"a,b"``); None is the default CPU set.
    - ``db``: a path or an open :class:`~collage_ml.db.Database`; None is :func:`default_db_path`.
    - ``budget_minutes``: stop after this many minutes (checked between candidates; a candidate in
      flight finishes, at most ``timeout`` seconds). ``max_candidates``: measure at most this many
      new candidates (cache hits do not count).
    - ``sampler``: ``enumerate``, ``random`` or ``focus`` (needs ``cost_model``: an object with
      ``predict(candidates) -> (mean, uncertainty)`` or a saved model's path).
    - ``shard``: ``"i/n"`` or ``(i, n)``: measure only keys whose stable hash falls in shard i.
    - ``batch_sizes``: batch sizes of zoo models; default ``(1,)`` for enumerate and
      ``(1, 2, 4, 8, 16)`` for random and focus.
    - ``inductor_fraction``: the deterministic share of inductor candidates measured.
    - ``samples_per_graph``: random subgraphs per (model, batch) for random and focus.
    - ``timing``: a :class:`~collage_ml.measure.timing.TimingConfig`; ``timeout`` bounds one
      candidate (seconds).
    - ``max_reference_bytes``: sources whose activations exceed this are skipped (listed in
      ``summary.skipped``).
    - ``dry_run``: plan only; the summary's ``planned`` says what would be measured.
    - ``ray_address``: run ``ray_shards`` (default: one per alive node with a CPU) shards as Ray
      tasks at this address (``"local"`` starts a local instance on loopback) and merge their
      databases into ``db``; Ray reruns a shard whose worker died up to ``ray_retries`` times
      (default :data:`RAY_TASK_RETRIES`), resuming its database.
    - ``on_measurement(measurement)`` is called after each new measurement.
    - ``recalibrate_hours``: the machine is calibrated (the probe set, ``measure.probes``) when the run
      starts, unless the database has a calibration of it younger than this, and again before a source once
      the newest is older (None: never); each calibration counts in the budget and the summary.

    Ctrl-C stops cleanly: the summary says ``stopped="interrupted"``.
    """
    t_start = _clock()
    _check_sampler(sampler)
    if sampler == "focus" and cost_model is None:
        raise CollageError(FOCUS_NEEDS_MODEL)
    shard_t = parse_shard(shard)
    if budget_minutes is not None and not budget_minutes >= 0:
        raise ValueError(f"budget_minutes must be >= 0, got {budget_minutes}")
    if max_candidates is not None and (isinstance(max_candidates, bool) or int(max_candidates) != max_candidates or max_candidates < 0):
        raise ValueError(f"max_candidates must be an integer >= 0, got {max_candidates}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if recalibrate_hours is not None and not recalibrate_hours >= 0:
        raise ValueError(f"recalibrate_hours must be >= 0 or None, got {recalibrate_hours}")
    if ray_address is not None:
        if shard_t is not None:
            raise ValueError("--shard and --ray cannot be combined: with --ray, each node collects one shard")
        return _collect_ray(
            ray_address, db=db, progress=progress, ray_shards=ray_shards,
            max_retries=RAY_TASK_RETRIES if ray_retries is None else ray_retries,
            kwargs=dict(
                models=models, backends=backends, budget_minutes=budget_minutes, max_candidates=max_candidates,
                sampler=sampler, seed=seed, threads=threads, max_region_size=max_region_size,
                batch_sizes=batch_sizes, cost_model=cost_model, inductor_fraction=inductor_fraction,
                samples_per_graph=samples_per_graph, timing=timing, timeout=timeout,
                max_reference_bytes=max_reference_bytes, dry_run=dry_run, recalibrate_hours=recalibrate_hours,
            ),
        )

    from collage_ml.backends.base import resolve_backends
    from collage_ml.db import Database
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.measure.runner import default_threads

    # usage errors before the database is touched
    resolve_models(models)
    resolve_backends(backends)
    parse_batch_sizes(batch_sizes)
    threads = threads or default_threads()
    hw = fingerprint(threads)
    own_db = not isinstance(db, Database)
    db_path = Path(os.fspath(db)) if own_db and db is not None else default_db_path() if own_db else db.path
    if own_db:
        if dry_run:
            database = Database(db_path, create=False, readonly=True) if db_path.exists() else None
        else:
            database = Database(db_path)
    else:
        database = db
    feedback = None
    pre_cal = (0, 0.0)  # (calibrations, seconds) before planning: the focus sampler's, below
    runner = None  # one runner (and its workers) for the whole run: the calibration before planning and _measure
    try:
        if sampler == "focus":
            # the one feedback loop, shared with ``place``: new measurements update the model, saved next to the DB
            from collage_ml.featurize.hardware import HardwareDesc
            from collage_ml.models.base import CostModel
            from collage_ml.models.feedback import Feedback, updated_path

            from collage_ml.measure.probes import PROBE_SET_VERSION

            cost_model = _load_cost_model(cost_model)
            if isinstance(cost_model, CostModel):
                if recalibrate_hours is not None and not dry_run:
                    # the sampler weighs every source's candidates up front, with this machine's probes: a database
                    # that never saw the machine (or saw it long ago) is calibrated before, not after, planning
                    runner = _runner(database, threads, timing, timeout)
                    pre_cal = _calibrate_first(runner, backends, recalibrate_hours, progress)
                # this machine, with the probe results the database holds for it (`collage-ml calibrate` records them)
                here = HardwareDesc.current(threads).with_probes(
                    database.probe_table(hw, PROBE_SET_VERSION) if database is not None else None)
                cost_model.hw = here  # the focus sampler's predictions are for this machine
                if not dry_run:
                    feedback = Feedback(cost_model, updated_path(db_path, hw, cost_model.kind), here)
        known = database.known_keys(hw, getattr(timing, "name", None)) if database is not None else set()
        if _skip:
            known |= {tuple(k) for k in _skip.get(hw, ())}
        # the progress bar (stderr): ETA, candidates per minute and invalid count by backend
        with Bar(progress, stderr=True, rate=True) as prog:
            kw = dict(
                sampler=sampler, shard=shard_t, seed=seed, threads=threads, max_region_size=max_region_size,
                batch_sizes=batch_sizes, inductor_fraction=inductor_fraction, samples_per_graph=samples_per_graph,
                known=known, cost_model=cost_model, max_reference_bytes=max_reference_bytes,
            )
            lazy = not dry_run and sampler != "focus"
            if lazy:  # each source is measured as soon as it is planned: the budget covers planning too
                p, works = plan_lazily(models, backends, **kw, keep_graphs=True)
            else:  # the focus sampler draws over every source's weights; a dry run only counts
                p = plan(models, backends, **kw, max_candidates=max_candidates, on_source=prog.planning)
                prog.planned()
            summary = CollectSummary(
                db=str(db_path), hardware=hw, sampler=sampler, models=p.models,
                backends=[b.name for b in p.backends], batch_sizes=p.batch_sizes,
                shard=f"{shard_t[0]}/{shard_t[1]}" if shard_t else None, seed=seed, threads=threads,
                max_region_size=max_region_size, inductor_fraction=inductor_fraction,
            )
            summary.calibrations, summary.calibrate_s = pre_cal
            if dry_run:
                _add_plan_counts(summary, p)
                summary.stopped = "dry-run"
                summary.remaining = p.planned
            else:
                total = None if lazy else p.planned if max_candidates is None else min(p.planned, int(max_candidates))
                prog.task("measuring", total)
                try:
                    runner = runner or _runner(database, threads, timing, timeout)
                    _measure(p, works if lazy else p.works, runner, summary, prog, t_start, budget_minutes,
                             max_candidates, on_measurement, feedback, recalibrate_hours)
                finally:
                    summary.measure_s += pre_cal[1]  # a calibration before planning counts as the run's others do
                    _add_plan_counts(summary, p)
        summary.elapsed_s = _clock() - t_start
        if progress:
            print_summary(summary)
        return summary
    finally:
        if runner is not None:
            runner.close()
        if own_db and database is not None:
            database.close()


def _runner(database, threads: int, timing, timeout: float):
    """The run's measurement runner (its workers start on first use)."""
    from collage_ml.measure.runner import Runner
    from collage_ml.measure.timing import TimingConfig

    return Runner(db=database, threads=threads, timeout=timeout, timing=timing or TimingConfig())


def _calibrate_first(runner, backends, hours: float, progress: bool) -> tuple[int, float]:
    """Brings the machine's calibration up to date before the focus sampler plans (``measure.probes.recalibrate``,
    as before each source), with the runner that then measures; returns (calibrations run, seconds)."""
    from collage_ml.backends.base import resolve_backends
    from collage_ml.measure.probes import recalibrate

    t0 = _clock()
    ran = bool(recalibrate(runner, resolve_backends(backends), hours * 3600, progress=progress))
    return int(ran), _clock() - t0 if ran else 0.0


def _add_plan_counts(summary: CollectSummary, p: CollectPlan) -> None:
    """Adds what planning counted (candidates, cache hits, subsampled, planned) to the summary, and the
    sources a stopped run never planned."""
    for name, c in p.counts.items():
        b = summary.by_backend.setdefault(name, _new_backend_counts())
        for k in ("candidates", "cache_hits", "subsampled", "planned"):
            b[k] += c[k]
    summary.candidates += sum(c["candidates"] for c in p.counts.values())
    summary.cache_hits += sum(c["cache_hits"] for c in p.counts.values())
    summary.subsampled += sum(c["subsampled"] for c in p.counts.values())
    summary.planned = p.planned
    summary.skipped[:0] = p.skipped
    summary.unplanned_sources = p.sources - p.sources_planned


def _measure(
    p: CollectPlan, works: list[_Work] | Iterator[_Work], runner, summary: CollectSummary, prog: Bar,
    t_start: float, budget_minutes, max_candidates, on_measurement, feedback=None,
    recalibrate_hours: float | None = None,
) -> None:
    """Measures the works through the tuner's measure step, which commits each measurement and hands it to
    ``feedback`` (the focus sampler's cost model; flushed once per source). ``works`` is a list (planned up
    front) or :func:`plan_lazily`'s iterator, which plans the next source when asked; the bar's total is then
    the candidates planned so far, extrapolated over the sources left. Before each source the machine's
    calibration is brought up to date (``recalibrate_hours``; :func:`~collage_ml.measure.probes.recalibrate`)."""
    from collage_ml.candidates import Candidate
    from collage_ml.cost import CandidateKey
    from collage_ml.ir.graph import SubGraph
    from collage_ml.measure.probes import recalibrate
    from collage_ml.search.tuner import Tuner

    deadline = None if budget_minutes is None else t_start + budget_minutes * 60
    done = 0  # planned items dealt with: measured, or found in the DB meanwhile
    t_measure = _clock()

    def stop_reason() -> str | None:
        if max_candidates is not None and summary.measured >= max_candidates:
            return "max_candidates"
        if deadline is not None and _clock() >= deadline:
            return "budget"
        return None

    tuner = Tuner(runner, feedback=feedback)
    try:
        queue = deque(works) if isinstance(works, list) else None

        def more() -> bool:  # a source is left: planned and queued, or (planned lazily) not planned yet
            return bool(queue) if queue is not None else p.sources_planned < p.sources

        while more():
            if (why := stop_reason()) is not None:
                summary.stopped = why
                break
            if queue is None:  # plans the next source now
                prog.phase(f"planning source {p.sources_planned + 1}/{p.sources}")
                work = next(works, None)
                if work is None:
                    break
                total = p.planned + round(p.planned / p.sources_planned * (p.sources - p.sources_planned))
                prog.set_total(total if max_candidates is None else min(total, int(max_candidates)))
            else:
                work = queue.popleft()
            if recalibrate_hours is not None:
                prog.phase("calibrating (the probe set)")
                t_cal = _clock()
                summary.calibrations += bool(recalibrate(runner, p.backends, recalibrate_hours * 3600))
                summary.calibrate_s += _clock() - t_cal
            prog.phase(f"{work.label}: reference")
            try:
                graph = work.graph if work.graph is not None else _import(work.model, work.batch)
                work.graph = None  # the work holds no graph once it is measured
                reference = graph.reference()
            except Exception as e:  # an overnight run goes on with the next model
                summary.skipped.append(f"{work.label}: {describe(e, 10**6)}")
                continue
            groups: dict[int, list] = {}
            for it in work.items:
                groups.setdefault(it[1], []).append(it)
            # one backend per phase, in the order the backends were given; under the protocol's ``interleave``
            # one chunk of every backend per call, their passes interleaved by the runner
            queues = {bi: deque(groups[bi]) for bi in sorted(groups)}
            while queues and summary.stopped == "complete":
                if (why := stop_reason()) is not None:
                    summary.stopped = why
                    break
                turn = list(queues) if runner.timing.interleave else [next(iter(queues))]
                prog.phase(f"{work.label} · " + ("all backends" if len(turn) > 1 else p.backends[turn[0]].name))
                chunk = []
                for bi in turn:  # in chunks: the protocol's passes spread each candidate's windows
                    room = runner.timing.pass_chunk
                    if max_candidates is not None:
                        room = min(room, max_candidates - summary.measured - len(chunk))
                        if room <= 0:
                            break
                    items, taken = queues[bi], 0
                    while items and taken < room:
                        mask, _, pattern, key = items.popleft()
                        c = Candidate(SubGraph(graph, mask), p.backends[bi], pattern)
                        if _key_tuple(c.key) != key:  # the re-imported graph must be the planned one
                            raise CollageError(
                                f"{work.label} changed between planning and measuring (a node set hashes "
                                "differently); run collect again"
                            )
                        if runner.lookup(CandidateKey(*key)) is not None:  # measured meanwhile: by another
                            summary._hit(c.backend.name)  # process, or as a probe of this run's calibration
                            done += 1
                            prog.step()
                            continue
                        chunk.append(c)
                        taken += 1
                    if not items:
                        del queues[bi]
                if not chunk:
                    continue
                new: dict = {}
                ms = tuner.measure(chunk, reference, work.family, on_result=lambda c, m, n: new.update({c.key: n}))
                for c, m in zip(chunk, ms):
                    done += 1
                    if not new[c.key]:  # another process committed it first
                        summary._hit(c.backend.name)
                        prog.step()
                        continue
                    summary._record(c.backend.name, work.family, m.valid)
                    if on_measurement is not None:
                        on_measurement(m)
                    prog.step(c.backend.name, m.valid)
            if tuner.flush(work.family):
                summary.model_updates += 1
            del reference, graph
            if summary.stopped != "complete":
                break
    except KeyboardInterrupt:
        summary.stopped = "interrupted"
    finally:
        summary.measure_s = _clock() - t_measure
        summary.remaining = max(0, p.planned - done)
