"""Plans: the data of a placement.

A :class:`Plan` is a cover of a Graph by non-overlapping partitions, each on
one backend, with predicted and measured costs; it serialises to JSON.
:meth:`Plan.compile` returns a :class:`~collage_ml.placed.PlacedModel`
(compiling, running, saving and loading live in :mod:`collage_ml.placed`).
:meth:`Plan.merged` merges adjacent partitions on the same *region* backend
whenever their union is convex, which compiling does first, so a plan is not
cut into many small sessions (fusion inside a region backend is worth more
than most per-op choices).

A plan file is data. It names each partition's backend by its registered name
and configuration (``onnxruntime[spin=on]``); loading resolves that name
through the backend registry (entry-point plug-ins included) and checks the
configuration against the backend's grid, and never imports or calls anything
the file names. ``Partition.backend_spec`` (module, class, constructor
arguments) exists only in memory, for backends this process built itself; it
is written only with ``to_dict(specs=True)`` and read back only with
``from_dict(..., trusted=True)``, for a channel between a process and its own
workers. :meth:`Partition.resolve_backend` turns a partition into its Backend.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from collage_ml.backends.base import Backend, get_backend
from collage_ml.errors import BackendError, CollageError, PlanError, first_line
from collage_ml.ir.graph import Graph, iter_bits

if TYPE_CHECKING:
    from collage_ml.placed import PlacedModel

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

    def resolve_backend(self) -> Backend:
        """The Backend this partition runs on, checked to be available.

        An in-memory ``backend_spec`` (a backend this process, or its parent, built) is rebuilt as it is;
        otherwise, and should that fail, the registered name is resolved through the registry. (The name
        ``backend`` is the partition's field, the backend's registered name, so this method has another.)
        """
        if self.backend_spec:  # in memory only: plan files never carry one
            try:
                b = Backend.from_spec(self.backend_spec, trusted=True)
            except Exception:
                b = get_backend(self.backend)
        else:
            b = get_backend(self.backend)
        b.require()
        return b

    def is_region(self) -> bool:
        """Whether this partition's backend has region patterns (False when it cannot be resolved)."""
        try:
            return any(pt.kind == "region" for pt in self.resolve_backend().patterns)
        except CollageError:
            return False


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
        """Compiles the plan into a runnable :class:`~collage_ml.placed.PlacedModel`
        (:func:`collage_ml.placed.compile_plan`)."""
        from collage_ml.placed import compile_plan

        return compile_plan(self, graph, threads, merge)


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

