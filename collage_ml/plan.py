"""Plans and placed models.

A :class:`Plan` is a cover of a Graph by non-overlapping partitions, each on
one backend, with predicted and measured costs; it serialises to JSON.
:meth:`Plan.compile` returns a :class:`PlacedModel`, which runs the partitions
in topological order and hands tensors between backends without copies
(numpy arrays, torch tensors and TVM tensors all speak DLPack on the CPU).

Before compiling, adjacent partitions on the same *region* backend are merged
whenever their union is convex, so a plan is not cut into many small
sessions (fusion inside a region backend is worth more than most per-op
choices).

A plan file is data. It names each partition's backend by its registered name
and configuration (``onnxruntime[spin=on]``); loading resolves that name
through the backend registry (entry-point plug-ins included) and checks the
configuration against the backend's grid, and never imports or calls anything
the file names. ``Partition.backend_spec`` (module, class, constructor
arguments) exists only in memory, for backends this process built itself; it
is written only with ``to_dict(specs=True)`` and read back only with
``from_dict(..., trusted=True)``, for a channel between a process and its own
workers. A placed-model folder also records the SHA-256 of its ``model.onnx``,
checked at load, so swapped weights are refused instead of run.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from collage_ml.backends.base import Backend, Executable, get_backend, to_numpy
from collage_ml.errors import BackendError, CollageError, ModelError, PlanError, first_line
from collage_ml.ir.graph import Graph, iter_bits

PLAN_FORMAT = 2  # 2: backends by registered name only (1 also stored an importable backend_spec)
READ_FORMATS = (1, 2)


@dataclass
class Partition:
    backend: str
    nodes: list[int]
    predicted_ms: float | None = None
    measured_ms: float | None = None
    #: (module, class, config) to rebuild an in-memory backend; never written to or read from a plan file
    backend_spec: tuple[str, str, dict] | None = None

    @property
    def mask(self) -> int:
        m = 0
        for i in self.nodes:
            m |= 1 << i
        return m


@dataclass
class Plan:
    model: str
    partitions: list[Partition]
    hardware: str = ""
    threads: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    predicted_ms: float | None = None
    measured_ms: float | None = None
    graph_hash: str = ""

    # -- construction ---------------------------------------------------------------
    @staticmethod
    def single(graph: Graph, backend: Backend, **kw) -> "Plan":
        """The whole model on one backend."""
        return Plan(graph.name, [Partition(backend.name, list(range(len(graph))), backend_spec=backend.spec())],
                    graph_hash=graph.whole().hash, **kw)

    @staticmethod
    def from_candidates(graph: Graph, candidates: Sequence, costs: Sequence[float | None] = (), **kw) -> "Plan":
        parts = []
        for i, c in enumerate(candidates):
            ms = costs[i] * 1e3 if i < len(costs) and costs[i] is not None else None
            parts.append(Partition(c.backend.name, list(c.subgraph.node_indices), measured_ms=ms,
                                   backend_spec=c.backend.spec()))
        return Plan(graph.name, parts, graph_hash=graph.whole().hash, **kw)

    # -- checks and canonical form -------------------------------------------------------
    def validate(self, graph: Graph) -> None:
        seen = 0
        for k, p in enumerate(self.partitions):
            if not p.nodes or not all(_is_int(i) for i in p.nodes):
                raise PlanError(f"plan partition {k} on {p.backend} has no nodes or a node index that is not an integer")
            if max(p.nodes) >= len(graph) or min(p.nodes) < 0:
                raise PlanError(f"plan partition {k} on {p.backend} names nodes outside the graph "
                                f"(indices {min(p.nodes)}..{max(p.nodes)}, the graph has {len(graph)} nodes)")
            if len(set(p.nodes)) != len(p.nodes):
                raise PlanError(f"plan partition {k} on {p.backend} lists a node twice")
            m = p.mask
            if m & seen:
                raise PlanError("plan partitions overlap")
            if not graph.is_convex(m):
                raise PlanError(f"plan partition {k} on {p.backend} with {len(p.nodes)} nodes is not convex")
            seen |= m
        if seen != graph.all_mask:
            missing = len(graph) - bin(seen).count("1")
            raise PlanError(f"plan does not cover the graph ({missing} node(s) unassigned)")
        if _partition_order(graph, self.partitions) is None:
            raise PlanError("plan partitions depend on each other in a cycle")
        if self.graph_hash and self.graph_hash != graph.whole().hash:
            raise PlanError("this plan was made for a different model (graph hash mismatch)")

    def canonical(self) -> tuple:
        """A hashable form: the set of (backend, nodes) partitions."""
        return tuple(sorted((p.backend, tuple(sorted(p.nodes))) for p in self.partitions))

    def backends_used(self) -> list[str]:
        return sorted({p.backend for p in self.partitions})

    # -- merging -------------------------------------------------------------------------------
    def merged(self, graph: Graph, region_backends: set[str]) -> "Plan":
        """Merges connected partitions on the same region backend while their union stays convex."""
        parts = [Partition(p.backend, sorted(p.nodes), p.predicted_ms, p.measured_ms, p.backend_spec)
                 for p in self.partitions]
        changed = True
        while changed:
            changed = False
            for i in range(len(parts)):
                if parts[i].backend not in region_backends:
                    continue
                mi = parts[i].mask
                nb = 0
                for n in iter_bits(mi):
                    nb |= graph.pred_mask[n] | graph.succ_mask[n]
                for j in range(len(parts)):
                    if j == i or parts[j].backend != parts[i].backend:
                        continue
                    mj = parts[j].mask
                    if not (nb & mj and graph.is_convex(mi | mj)):
                        continue
                    trial = [q for k, q in enumerate(parts) if k not in (i, j)]
                    trial.append(Partition(parts[i].backend, sorted(parts[i].nodes + parts[j].nodes),
                                           None, None, parts[i].backend_spec))
                    # convex partitions can still depend on each other both ways: keep the plan acyclic
                    if _partition_order(graph, trial) is None:
                        continue
                    parts = trial
                    changed = True
                    break
                if changed:
                    break
        out = Plan(self.model, parts, self.hardware, self.threads, dict(self.versions), self.predicted_ms,
                   None, self.graph_hash)
        return out

    def execution_order(self, graph: Graph) -> list[int]:
        """Partition indices in a topological order of the partition graph."""
        order = _partition_order(graph, self.partitions)
        if order is None:
            raise CollageError("plan partitions depend on each other in a cycle")
        return order

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self, specs: bool = False) -> dict:
        """The plan as JSON-able data: backends by registered name. ``specs=True`` adds each partition's
        in-memory ``backend_spec``, for a process's own workers only (see the module docstring)."""
        d = asdict(self)
        if not specs:
            for p in d["partitions"]:
                p.pop("backend_spec", None)
        d["format"] = PLAN_FORMAT
        return d

    def to_json(self, specs: bool = False) -> str:
        return json.dumps(self.to_dict(specs), indent=1)

    @staticmethod
    def from_dict(d: Mapping, trusted: bool = False) -> "Plan":
        """Reads a plan; raises :class:`PlanError` naming the first problem.

        Each backend name is resolved through the registry and its configuration checked against the
        backend's grid. A ``backend_spec`` in the data is never imported: a legacy (format 1) spec is
        accepted only when it is exactly the registered backend of that name. ``trusted=True`` keeps
        specs as they are, for data this process (or its parent) wrote itself.
        """
        if not isinstance(d, Mapping):
            raise PlanError(f"not a collage-ml plan (a JSON {type(d).__name__}, not an object)")
        fmt = d.get("format")
        if fmt not in READ_FORMATS or isinstance(fmt, bool):
            raise PlanError(f"unsupported plan format {fmt!r} (this collage-ml reads {', '.join(map(str, READ_FORMATS))})")
        _field(d, "model", str)
        parts_in = _field(d, "partitions", list)
        if not parts_in:
            raise PlanError("plan has no partitions")
        parts = [_partition_from_dict(k, p, trusted) for k, p in enumerate(parts_in)]
        threads = _field(d, "threads", int, 1)
        if threads < 1:
            raise PlanError(f"plan threads must be a positive integer, got {threads!r}")
        versions = _field(d, "versions", dict, {})
        return Plan(d["model"], parts, _field(d, "hardware", str, ""), threads, dict(versions),
                    _field(d, "predicted_ms", numbers.Real, None), _field(d, "measured_ms", numbers.Real, None),
                    _field(d, "graph_hash", str, ""))

    @staticmethod
    def from_json(text: str, trusted: bool = False) -> "Plan":
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as e:
            raise PlanError(f"not a collage-ml plan: not valid JSON ({first_line(e)})") from None
        return Plan.from_dict(d, trusted=trusted)

    # -- compile -----------------------------------------------------------------------------------
    def compile(self, graph: Graph, threads: int | None = None, merge: bool = True) -> "PlacedModel":
        self.validate(graph)
        plan = self
        if merge:
            region = {p.backend for p in self.partitions if _is_region(p)}
            plan = self.merged(graph, region)
        return PlacedModel(graph, plan, threads or self.threads)


def _partition_order(graph: Graph, parts: Sequence[Partition]) -> list[int] | None:
    """A topological order of the partitions (lowest first node first), or None when they form a cycle."""
    import heapq

    owner = {}
    for k, p in enumerate(parts):
        for n in p.nodes:
            owner[n] = k
    deps = [set() for _ in parts]
    users: list[set[int]] = [set() for _ in parts]
    for k, p in enumerate(parts):
        for n in p.nodes:
            for q in graph.preds[n]:
                if owner[q] != k:
                    deps[k].add(owner[q])
                    users[owner[q]].add(k)
    indeg = [len(d) for d in deps]
    ready = [(min(parts[k].nodes), k) for k in range(len(parts)) if not indeg[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for j in users[k]:
            indeg[j] -= 1
            if not indeg[j]:
                heapq.heappush(ready, (min(parts[j].nodes), j))
    return order if len(order) == len(parts) else None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_MISSING = object()


def _field(d: Mapping, key: str, kind, default=_MISSING, where: str = "plan"):
    """``d[key]`` checked to be of ``kind`` (None allowed when the default is None)."""
    if key not in d:
        if default is _MISSING:
            raise PlanError(f"not a collage-ml plan (no {key!r})" if where == "plan" else f"{where} has no {key!r}")
        return default
    v = d[key]
    if v is None and default is None:
        return None
    ok = _is_int(v) if kind is int else isinstance(v, kind) and not isinstance(v, bool)
    if not ok:
        name = "integer" if kind is int else "number" if kind is numbers.Real else kind.__name__
        raise PlanError(f"{where}: {key!r} must be a {name}, got {type(v).__name__} {str(v)[:40]!r}")
    return v


def _partition_from_dict(k: int, p: object, trusted: bool) -> Partition:
    where = f"plan partition {k}"
    if not isinstance(p, Mapping):
        raise PlanError(f"{where} is a JSON {type(p).__name__}, not an object")
    name = _field(p, "backend", str, where=where)
    nodes = _field(p, "nodes", list, where=where)
    if not nodes or not all(_is_int(i) and i >= 0 for i in nodes):
        raise PlanError(f"{where} on {name!r}: 'nodes' must be a non-empty list of node indices (integers >= 0)")
    pred = _field(p, "predicted_ms", numbers.Real, None, where)
    meas = _field(p, "measured_ms", numbers.Real, None, where)
    spec = p.get("backend_spec")
    if trusted:
        return Partition(name, list(nodes), pred, meas, tuple(spec) if spec else None)
    try:
        b = get_backend(name)  # the registry only: unknown names and configurations off the grid raise
    except BackendError as e:
        raise PlanError(f"{where}: {e}") from None
    if spec is not None:
        _check_legacy_spec(where, b, spec)
    return Partition(b.name, list(nodes), pred, meas, None)


def _check_legacy_spec(where: str, b: Backend, spec: object) -> None:
    """A format-1 plan's (module, class, config) is accepted only when it is exactly the registered backend
    ``b``: it is compared with the registry, never imported or called."""
    cls = type(b)
    ok = (isinstance(spec, (list, tuple)) and len(spec) == 3 and isinstance(spec[0], str)
          and isinstance(spec[1], str) and isinstance(spec[2], dict))
    if ok:
        module, qualname, config = spec
        mine = json.loads(json.dumps(b.config, default=str))
        ok = (module == cls.__module__ and qualname == cls.__qualname__
              and all(key in mine and json.dumps(mine[key]) == json.dumps(v) for key, v in config.items()))
    if not ok:
        shown = json.dumps(spec, default=str)[:120]
        raise PlanError(f"{where}: its backend_spec {shown} is not the registered backend {b.name!r} "
                        f"({cls.__module__}.{cls.__qualname__}); a plan file may only name registered backends")


def _backend_of(p: Partition) -> Backend:
    if p.backend_spec:  # in memory only: a backend this process built (plan files never carry one)
        from collage_ml.measure.runner import build_backend

        try:
            b = build_backend(p.backend_spec)
        except Exception:
            b = get_backend(p.backend)
    else:
        b = get_backend(p.backend)
    b.require()
    return b


def _is_region(p: Partition) -> bool:
    try:
        return any(pt.kind == "region" for pt in _backend_of(p).patterns)
    except CollageError:
        return False


class PlacedModel:
    """A compiled plan: call it like the model (numpy arrays or torch tensors, positional or by name)."""

    def __init__(self, graph: Graph, plan: Plan, threads: int = 1):
        self.graph = graph
        self.plan = plan
        self.threads = threads
        self.report: Mapping[str, Any] = {}  # place sets a PlaceReport; a loaded model, the JSON object
        order = plan.execution_order(graph)
        self._steps: list[tuple[Executable, tuple[str, ...], tuple[str, ...]]] = []
        from collage_ml.backends.onnxruntime_backend import check_pool_compatible

        backends = {k: _backend_of(plan.partitions[k]) for k in order}
        check_pool_compatible(list(backends.values()))  # ORT's shared and own pools cannot meet in one process
        for k in order:
            p = plan.partitions[k]
            backend = backends[k]
            exe = backend.compile(graph.subgraph(p.mask), threads=threads)
            self._steps.append((exe, tuple(exe.input_names), tuple(exe.output_names)))
        # free each intermediate after its last use
        last_use: dict[str, int] = {}
        for s, (_, ins, _) in enumerate(self._steps):
            for t in ins:
                last_use[t] = s
        outs = set(graph.output_names)
        self._free = [[t for t in ins if last_use.get(t) == s and t not in outs and t not in graph.input_names]
                      for s, (_, ins, _) in enumerate(self._steps)]
        self.input_names = graph.input_names
        self.output_names = graph.output_names

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Runs on a dict of inputs; returns the outputs as the backends produced them (DLPack-capable)."""
        env: dict[str, Any] = dict(inputs)
        for (exe, ins, outs), free in zip(self._steps, self._free):
            res = exe(*[env[t] for t in ins])
            for t, v in zip(outs, res):
                env[t] = v
            for t in free:
                del env[t]
        return {t: env[t] for t in self.output_names}

    def __call__(self, *args: Any, **kwargs: Any):
        """Positional inputs in model order (or keywords by name); returns numpy or torch like the inputs."""
        if args and kwargs:
            raise TypeError("pass inputs positionally or by name, not both")
        if args:
            if len(args) != len(self.input_names):
                raise TypeError(f"expected {len(self.input_names)} input(s) {list(self.input_names)}, got {len(args)}")
            feeds = dict(zip(self.input_names, args))
        else:
            missing = [n for n in self.input_names if n not in kwargs]
            if missing:
                raise TypeError(f"missing input(s) {missing}")
            feeds = dict(kwargs)
        torch_in = any(type(v).__module__.startswith("torch") for v in feeds.values())
        feeds = {k: _contiguous(v) for k, v in feeds.items()}
        out = self.run(feeds)
        if torch_in:
            import torch

            res = [torch.from_dlpack(_dlpackable(out[t])) for t in self.output_names]
        else:
            res = [to_numpy(out[t]) for t in self.output_names]
        return res[0] if len(res) == 1 else tuple(res)

    def save(self, path: str | Path) -> Path:
        """Writes ``model.onnx`` (the imported graph) and ``plan.json``; :func:`load` recompiles."""
        import onnx

        d = Path(path)
        d.mkdir(parents=True, exist_ok=True)
        onnx.save(self.graph.model, str(d / "model.onnx"))
        plan = self.plan.to_dict()
        plan["model_sha256"] = _sha256(d / "model.onnx")
        (d / "plan.json").write_text(json.dumps(plan, indent=1))
        if self.report:
            (d / "report.json").write_text(json.dumps(dict(self.report), indent=1, default=str))
        return d

    def time(self, inputs: Mapping[str, Any] | None = None, timing=None) -> float:
        """Median end-to-end latency in seconds, by the measurement timing rules."""
        from collage_ml.measure.timing import TimingConfig, time_callable

        feeds = dict(inputs) if inputs is not None else self.graph.example_inputs()
        return time_callable(lambda: self.run(feeds), timing or TimingConfig()).median


def _contiguous(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    if hasattr(x, "is_contiguous") and not x.is_contiguous():
        return x.contiguous()
    return x


def _dlpackable(x: Any) -> Any:
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return x.copy()
    return x


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise PlanError(f"{path}: cannot read {what}: {e.strerror or first_line(e)}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise PlanError(f"{path}: {what} is not valid JSON ({first_line(e)})") from None


def load(path: str | Path, threads: int | None = None) -> PlacedModel:
    """Loads a PlacedModel saved with :meth:`PlacedModel.save`, recompiling its backends.

    The folder is data: every backend is resolved by its registered name (see the module docstring), the
    plan must carry the graph hash of ``model.onnx`` and, from format 2, the SHA-256 of its bytes. Anything
    malformed or tampered with raises :class:`PlanError` (or :class:`ModelError` for an unreadable model)
    naming the file and the problem.
    """
    from collage_ml.ir.importers import from_onnx, load_onnx_file

    d = Path(path)
    if not (d / "plan.json").is_file() or not (d / "model.onnx").is_file():
        raise ModelError(f"{d}: not a saved placed model (expected plan.json and model.onnx)")
    pj = d / "plan.json"
    raw = _read_json(pj, "the plan")
    try:
        plan = Plan.from_dict(raw)
        if not plan.graph_hash:
            raise PlanError("plan has no graph_hash, so it cannot be checked against model.onnx")
        want = raw.get("model_sha256")
        if raw.get("format") != 1 or want is not None:
            if not isinstance(want, str) or not want:
                raise PlanError("plan has no model_sha256 (the content hash of model.onnx)")
            if want != _sha256(d / "model.onnx"):
                raise PlanError("model.onnx is not the model this plan was saved with (content hash mismatch: "
                                "its weights or graph were changed)")
    except PlanError as e:
        raise PlanError(f"{pj}: {e}") from None
    graph = from_onnx(load_onnx_file(d / "model.onnx"), name=plan.model)
    try:
        plan.validate(graph)
        for k, p in enumerate(plan.partitions):
            try:
                _backend_of(p)
            except BackendError as e:
                raise PlanError(f"plan partition {k}: {e}") from None
        pm = plan.compile(graph, threads=threads)
    except PlanError as e:
        raise PlanError(f"{pj}: {e}") from None
    rj = d / "report.json"
    if rj.exists():
        report = _read_json(rj, "the report")
        if not isinstance(report, dict):
            raise PlanError(f"{rj}: the report is a JSON {type(report).__name__}, not an object")
        pm.report = report
    return pm
