"""The public Python API.

Everything the CLI does goes through these functions; ``cli.py`` only parses
arguments and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from collage_ml.collector import DEFAULT_INDUCTOR_FRACTION, DEFAULT_MAX_REFERENCE_BYTES, DEFAULT_SAMPLES_PER_GRAPH
from collage_ml.defaults import (
    BACKENDS, COST_MODEL, DB, MAX_REGION_SIZE, MODE, MODEL_KIND, PROGRESS, RECALIBRATE_HOURS, SITTINGS,
    THREADS,
)
from collage_ml.ir import Graph, import_model


def inspect_model(
    model: Any,
    example_inputs: Sequence[Any] | None = None,
    *,
    batch: int = 1,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict:
    """A summary of a model: node count, FLOPs, parameter bytes, inputs, outputs and op histogram."""
    g = import_model(model, example_inputs, batch=batch, input_shapes=input_shapes)
    return g.summary()


def export_zoo(name: str, path: str | Path, batch: int = 1, seed: int = 0) -> Graph:
    """Writes zoo model ``name`` as a self-contained ONNX file with static shapes; returns its Graph."""
    import onnx

    g = import_model(name, batch=batch)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(g.model, str(path))
    return g


def place(
    model: Any,
    backends: Sequence[str] | str | None = BACKENDS,
    mode: str = MODE,
    db: Any = DB,
    *,
    example_inputs: Sequence[Any] | None = None,
    batch: int = 1,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    max_region_size: int = MAX_REGION_SIZE,
    threads: int | None = THREADS,
    cost_model: Any = COST_MODEL,
    measure_budget: int | None = None,
    guided_config: Any = None,
    stale_after_hours: float | None = None,
    in_context: bool = True,
    graph_level: bool = True,
    evo_config: Any = None,
    timing: Any = None,
    tolerance: Any = None,
    timeout: float = 300.0,
    progress: bool = PROGRESS,
    log: Callable[[str], None] | None = None,
):
    """Places ``model`` on the fastest mix of ``backends``; returns a runnable :class:`~collage_ml.placed.PlacedModel`.

    - ``model``: anything :func:`import_model` takes (a zoo name, an ``.onnx`` path, an
      ``onnx.ModelProto``, or an ``nn.Module`` with ``example_inputs``); ``batch`` sizes zoo
      models, ``input_shapes`` pins dynamic input dimensions.
    - ``backends``: a list or a comma-separated string of backend names (configurations such as
      ``"onnxruntime[spin=on]"`` allowed); None is the default CPU set.
    - ``mode``: ``"exhaustive"`` measures every candidate (cache hits excepted), as Collage did;
      ``"guided"`` measures only what ``cost_model`` cannot rule out.
    - ``db``: a database path or :class:`~collage_ml.db.Database`; None is the per-user database,
      so placing the same model twice hits the cache.
    - ``max_region_size``: the largest region candidate, in nodes (each backend's whole-model
      region is always tried as well). ``threads``: intra-op threads for every backend (None:
      ``$COLLAGE_ML_THREADS`` or the physical cores).
    - guided mode only: ``cost_model`` (``"default"``, ``"default:KIND"`` such as
      ``"default:blend"``, an artifact path or a :class:`~collage_ml.models.base.CostModel`), ``measure_budget`` (new candidates measured
      at most), ``guided_config`` (a :class:`~collage_ml.search.guided.GuidedConfig`).
    - ``stale_after_hours``: cache hits measured longer ago than this are of another hour of the machine: a few
      per backend are timed again and that backend's stale hits rescaled by the drift they show
      (:meth:`~collage_ml.measure.runner.Runner.refresh_stale`; the database keeps what it stored). None (the
      default) uses every hit as stored.
    - ``in_context``: the op-level DP charges each partition what it pays inside a plan beyond its latency timed
      alone (a cold call, and its constants evicted by the other partitions; measured once per machine and
      backend, :mod:`collage_ml.measure.context`). False prices a plan as the sum of its parts, as Collage did.
    - ``graph_level``: run the graph-level evolutionary search after the op-level DP, configured
      by ``evo_config`` (an :class:`~collage_ml.search.evolutionary.EvoConfig`).
    - ``timing`` (:class:`~collage_ml.measure.timing.TimingConfig`), ``tolerance``
      (:class:`~collage_ml.measure.timing.Tolerance`, the reference check) and ``timeout``
      (seconds per candidate) set the measurement protocol; None is the default protocol.
    - ``progress`` shows a progress bar; ``log(text)`` hears what the search is doing.

    The placed model's ``report`` holds the measurements, the baselines and the search statistics
    (README, "CLI"); ``collage_ml.show(placed)`` draws it.
    """
    from collage_ml.backends.base import resolve_backends
    from collage_ml.measure.timing import TimingConfig, Tolerance
    from collage_ml.search.tuner import place as _place

    graph = import_model(model, example_inputs, batch=batch, input_shapes=input_shapes)
    family = model if isinstance(model, str) and not str(model).endswith(".onnx") else graph.name
    from collage_ml.errors import BackendError
    from collage_ml.search.dp import NoCoverError

    bks = resolve_backends(backends)
    try:
        res = _place(
            graph, bks, mode, db, max_region_size=max_region_size, threads=threads,
            timing=TimingConfig() if timing is None else timing, tolerance=Tolerance() if tolerance is None else tolerance,
            timeout=timeout, progress=progress, log=log,
            family=family.removesuffix("-tiny") if isinstance(family, str) else "", graph_level=graph_level,
            evo_config=evo_config, cost_model=cost_model, measure_budget=measure_budget, guided_config=guided_config,
            stale_after_hours=stale_after_hours, in_context=in_context,
        )
    except NoCoverError as e:  # every candidate of some node was invalid: a fact about the backends, one line
        raise BackendError(f"cannot place {graph.name} on {', '.join(b.name for b in bks)}: {e}") from None
    return res.placed


def collect(
    models: str | Sequence[str] = "all",
    backends: Sequence[str] | str | None = BACKENDS,
    db: Any = DB,
    *,
    budget_minutes: float | None = None,
    max_candidates: int | None = None,
    sampler: str = "enumerate",
    shard: Any = None,
    seed: int = 0,
    threads: int | None = THREADS,
    max_region_size: int = MAX_REGION_SIZE,
    batch_sizes: Any = None,
    cost_model: Any = None,
    inductor_fraction: float = DEFAULT_INDUCTOR_FRACTION,
    samples_per_graph: int = DEFAULT_SAMPLES_PER_GRAPH,
    max_reference_bytes: int = DEFAULT_MAX_REFERENCE_BYTES,
    timing: Any = None,
    timeout: float = 120.0,
    dry_run: bool = False,
    ray_address: str | None = None,
    ray_shards: int | None = None,
    ray_retries: int | None = None,
    progress: bool = PROGRESS,
    on_measurement: Callable[[Any], None] | None = None,
    recalibrate_hours: float | None = RECALIBRATE_HOURS,
):
    """Measures candidates of ``models`` on ``backends`` into ``db``; resumable, shardable, budgeted.

    Returns a :class:`~collage_ml.collector.CollectSummary`. ``models`` are zoo names and ONNX
    paths (``"all"``: every full-size zoo model, ``"tiny"``: every ``-tiny`` one); ``backends``,
    ``db``, ``threads`` and ``max_region_size`` mean what they mean for :func:`place`.
    ``sampler`` is ``"enumerate"`` (what the placement search sees), ``"random"`` (random
    convex subgraphs at several batch sizes) or ``"focus"`` (where ``cost_model`` is least
    sure). ``budget_minutes`` and ``max_candidates`` stop early; ``shard="i/n"`` measures one
    shard; ``ray_address`` runs the shards on a Ray cluster. The machine is calibrated (the probe set)
    when the run starts and again once its newest calibration is ``recalibrate_hours`` old (None: never).
    Every other argument is described in :func:`collage_ml.collector.collect`.
    """
    from collage_ml.collector import collect as _collect

    return _collect(
        models, backends, db, budget_minutes=budget_minutes, max_candidates=max_candidates, sampler=sampler,
        shard=shard, seed=seed, threads=threads, max_region_size=max_region_size, batch_sizes=batch_sizes,
        progress=progress, ray_address=ray_address, cost_model=cost_model, inductor_fraction=inductor_fraction,
        samples_per_graph=samples_per_graph, timing=timing, timeout=timeout, max_reference_bytes=max_reference_bytes,
        dry_run=dry_run, on_measurement=on_measurement, ray_shards=ray_shards, ray_retries=ray_retries,
        recalibrate_hours=recalibrate_hours,
    )


def train(
    db: Any = DB,
    model: Any = MODEL_KIND,
    out: str | Path | None = None,
    holdout_families: Sequence[str] = (),
    params: Mapping[str, Any] | None = None,
    *,
    hardware: str | None = None,
    progress: bool = PROGRESS,
    pool_probes: bool | str = False,
    sittings: str = SITTINGS,
):
    """Fits a cost model on the valid measurements of ``db``; returns the :class:`~collage_ml.models.base.CostModel`.

    - ``db``: a database path or :class:`~collage_ml.db.Database`; None is the per-user database
      (the one :func:`place` and :func:`collect` write, so training closes the loop); a list of them
      trains on all their rows (one database per machine: the model reads each machine from its probes).
    - ``model``: ``"xgb"`` (gradient-boosted trees on flat features), ``"gnn"`` (a graph
      network) or ``"blend"`` (both, their log predictions averaged), built with ``params`` (e.g.
      ``{"n_estimators": 200}``; a blend's are ``member_params={"xgb": {...}, "gnn": {...}}``),
      or an unfitted CostModel.
    - ``out``: save the artifact in this directory (``guided`` placement and :func:`evaluate`
      take its path); None keeps it in memory only.
    - ``holdout_families``: source families (e.g. ``["bert"]``) left out of training and scored.
    - ``hardware``: train on this hardware fingerprint's rows only.
    - ``pool_probes``: of several databases, give each machine (fingerprint, threads, protocol) one probe
      table, the median of their calibrations, instead of each database its own (opt-in: it helped two
      CPU kinds of three, docs/results/cost-models.md, "One probe table per machine"); ``"node"`` pools each
      instance of a machine (a VM's boot, as its rows recorded it) apart.
    - ``sittings``: a candidate that several of the databases measured on one machine (a rerun) is one
      sample, the geometric mean of its sittings, each put on the first one's scale by the candidates they
      share (``models.dataset.merge_sittings``; ``"mean"``), or
      one sample per database (``"each"``); ``training["merged_sittings"]`` counts the merged ones.

    The model's ``training`` dict says what happened: ``n``, ``sources``, ``backends``,
    ``hardware``, ``fit_seconds``, ``params``, and for held-out families ``holdout[family]``
    (the metrics of :func:`evaluate`) and ``holdout_average``. This is ``collage-ml train``.
    """
    from collage_ml.models.training import train as _train

    return _train(db, model, out, holdout_families, params, hardware=hardware, progress=progress,
                  pool_probes=pool_probes, sittings=sittings)


def evaluate(
    db: Any = DB,
    artifact: Any = COST_MODEL,
    holdout_families: Sequence[str] = (),
    *,
    hardware: str | None = None,
    progress: bool = PROGRESS,
    sittings: str = SITTINGS,
) -> dict:
    """Scores a cost model on the valid measurements of ``db``; returns a dict of metrics.

    ``db`` is a database, or a list of them scored together; where several measured one candidate on one
    machine (sittings of it), ``sittings="mean"`` scores against their geometric mean, ``"each"`` against
    each (see :func:`train`).

    ``artifact`` is an artifact directory (from :func:`train` or ``collage-ml train``),
    ``"default"`` (the shipped model that fits this machine) or a CostModel. ``holdout_families``
    restricts the data to those families (default: every family). The dict has
    ``pairwise_accuracy``, ``kendall_tau``, ``mape``, ``within_10pct``, ``top1_regret``,
    ``backend_pairwise_accuracy``, ``backend_choice_regret`` and ``n`` (fractions; see
    :mod:`collage_ml.models.evaluate`), ``per_family`` metrics when several families are scored,
    and ``overlaps_training``: the scored families the model was trained on (a ``UserWarning``
    says so, since those numbers are not held out). This is ``collage-ml eval``.
    """
    from collage_ml.models.training import evaluate as _evaluate

    return _evaluate(db, artifact, holdout_families, hardware=hardware, progress=progress, sittings=sittings)


def load(path: str | Path, threads: int | None = THREADS):
    """Loads a placed model saved with ``PlacedModel.save(dir)``; its backends are recompiled.

    ``threads`` overrides the thread count the plan was placed with (None keeps it).
    """
    from collage_ml.placed import load as _load

    return _load(path, threads=threads)


def show(placed: Any, svg: str | Path | None = None, *, db: Any = DB, report: Mapping[str, Any] | None = None):
    """A picture and a table of a placed model's plan; returns a :class:`~collage_ml.viz.PlanView`.

    ``placed`` is a :class:`~collage_ml.placed.PlacedModel` or a directory written by
    ``PlacedModel.save`` (read without compiling any backend). ``svg``: write the picture
    there (Graphviz's ``dot`` lays it out; a :class:`~collage_ml.viz.GraphvizMissing` error
    says how to install it). ``db``: the measurement database that partition latencies and
    hand-off costs are read from when the plan does not carry them (None: the per-user one,
    when it exists). ``report`` overrides the placed model's report. ``view.table()`` is the
    partition table (a rich Table), ``view.rows()`` the same as dicts.
    """
    from collage_ml.db import default_db_path
    from collage_ml.errors import CollageError
    from collage_ml.placed import PlacedModel
    from collage_ml.viz import PlanView, read_placed

    if isinstance(placed, PlacedModel):
        graph, plan, rep = placed.graph, placed.plan, placed.report
    elif isinstance(placed, (str, Path)):
        graph, plan, rep = read_placed(placed)
    else:
        raise TypeError(f"show() takes a PlacedModel or a saved placed model's directory, not {type(placed).__name__}")
    if db is None:
        path = default_db_path()
        db = path if path.exists() else None
        try:
            view = PlanView(graph, plan, rep if report is None else report, db)
        except CollageError:  # an unreadable per-user database: draw without it
            view = PlanView(graph, plan, rep if report is None else report)
    else:
        if isinstance(db, (str, Path)) and not Path(db).exists():
            raise CollageError(f"no measurement database at {db}")
        view = PlanView(graph, plan, rep if report is None else report, db)
    if svg is not None:
        view.write_svg(svg)
    return view


def backends_info() -> list[dict]:
    """Every registered backend with its availability, version, device and pattern kinds."""
    from collage_ml.backends import all_backends

    return [b.info() for b in all_backends()]


def open_db(path: str | Path, create: bool = False, readonly: bool = False):
    """Opens a measurement database (``DatabaseError`` for a missing, corrupt or foreign file)."""
    from collage_ml.db import Database

    return Database(path, create=create and not readonly, readonly=readonly)


def db_stats(path: str | Path) -> dict:
    """Counts of the database's rows (read-only: an old-schema file is read as it is, not migrated)."""
    with open_db(path, readonly=True) as db:
        return db.stats()


def db_export_parquet(path: str | Path, out: str | Path) -> int:
    with open_db(path, readonly=True) as db:
        return db.export_parquet(out)


def calibrate(
    backends: Any = BACKENDS, *, db: Any = DB, threads: int | None = THREADS, progress: bool = PROGRESS,
    say: Callable[[str], None] | None = None, max_age_hours: float | None = RECALIBRATE_HOURS,
) -> dict[str, dict[str, float | None]]:
    """Measures the probe set (``measure.probes``) on this machine for ``backends`` (default: the CPU set),
    unless ``db`` has a calibration of it younger than ``max_age_hours`` (None: any age); returns
    {backend: {probe: seconds, or None where it cannot run}}, the newest calibration.

    Users who prepare a machine run it before they collect (``collect`` also calibrates on its own); the
    results are stored in ``db`` (default: the per-user database) under this machine's fingerprint and the
    current measurement protocol, a later calibration as a sitting of its own. The backends' in-context
    costs (``measure.context``, what a partition pays inside a plan) are measured and stored with them.
    """
    from collage_ml.backends import resolve_backends
    from collage_ml.db import Database, default_db_path
    from collage_ml.measure.context import ContextTable, measure_context
    from collage_ml.measure.probes import ensure_probes, recalibrate
    from collage_ml.measure.runner import Runner

    bs = resolve_backends(backends)
    for b in bs:
        b.require()
    if max_age_hours is not None and not max_age_hours >= 0:
        raise ValueError(f"max_age_hours must be >= 0 or None, got {max_age_hours}")
    own = db is None or isinstance(db, (str, Path))
    database = Database(default_db_path() if db is None else db) if own else db
    try:
        with Runner(db=database, threads=threads) as r:
            recalibrate(r, bs, None if max_age_hours is None else max_age_hours * 3600, progress=progress, say=say)
            probes = ensure_probes(r, bs)  # the newest calibration, read back
            table = ContextTable(measure_context(r, bs, say=say))
            for line in table.describe() if say is not None else ():
                say(line)
            return probes
    finally:
        if own:
            database.close()


def calibration_drift(
    backends: Any = BACKENDS, *, db: Any = DB, threads: int | None = THREADS, progress: bool = PROGRESS,
    timing: Any = None,
) -> dict:
    """Measures the probe set again, stores nothing, and compares it with the newest calibration ``db``
    holds for this machine: {"backends": {name: {"calibrated_at", "ratio", "probes"}}, "ratio"} (now / then,
    medians over the probes; below 1, the machine runs faster now). This is ``collage-ml calibrate --check``.

    The machine's speed moves by several percent over hours on the VMs measured (docs/results/cost-models.md,
    "One probe table per machine"), and this says by how much since then: whether a new sitting wants a
    calibration of its own before ``recalibrate_hours`` would give it one.
    """
    from collage_ml.backends import resolve_backends
    from collage_ml.db import Database, default_db_path
    from collage_ml.errors import CollageError
    from collage_ml.measure.probes import probe_drift
    from collage_ml.measure.runner import Runner

    bs = resolve_backends(backends)
    for b in bs:
        b.require()
    path = default_db_path() if db is None else db
    if isinstance(path, (str, Path)) and not Path(path).exists():
        raise CollageError(f"no measurement database at {path}; `collage-ml calibrate --db {path}` makes one")
    own = isinstance(path, (str, Path))
    database = Database(path, readonly=True) if own else path
    try:
        kw = {} if timing is None else {"timing": timing}
        with Runner(db=None, threads=threads, **kw) as r:
            return probe_drift(r, bs, database, progress=progress)
    finally:
        if own:
            database.close()


def db_merge(into: str | Path, other: str | Path, *, counts: bool = False) -> Any:
    """Adds every record of ``other`` missing from ``into`` (created if absent); returns the measurements added,
    or with ``counts`` {"measurements", "boundaries", "plan_runs", "calibrations"}: what was added of each kind."""
    with open_db(into, create=True) as db:
        n = db.merge(other)
        return {"measurements": n, "boundaries": 0, "plan_runs": 0, "calibrations": 0, **db.last_merge} if counts else n


__all__ = [
    "place", "load", "collect", "train", "evaluate", "show", "calibrate", "import_model", "inspect_model", "export_zoo", "backends_info", "open_db", "db_stats", "db_export_parquet",
    "db_merge",
]
