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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from collage_ml.backends.base import Backend, Executable, get_backend, to_numpy
from collage_ml.errors import CollageError, ModelError
from collage_ml.ir.graph import Graph, iter_bits

PLAN_FORMAT = 1


@dataclass
class Partition:
    backend: str
    nodes: list[int]
    predicted_ms: float | None = None
    measured_ms: float | None = None
    backend_spec: tuple[str, str, dict] | None = None  # (module, class, config) to rebuild the backend

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
        for p in self.partitions:
            m = p.mask
            if not p.nodes or max(p.nodes) >= len(graph) or min(p.nodes) < 0:
                raise CollageError(f"plan partition on {p.backend} names nodes outside the graph")
            if m & seen:
                raise CollageError("plan partitions overlap")
            if not graph.is_convex(m):
                raise CollageError(f"plan partition on {p.backend} with {len(p.nodes)} nodes is not convex")
            seen |= m
        if seen != graph.all_mask:
            missing = len(graph) - bin(seen).count("1")
            raise CollageError(f"plan does not cover the graph ({missing} node(s) unassigned)")
        if _partition_order(graph, self.partitions) is None:
            raise CollageError("plan partitions depend on each other in a cycle")
        if self.graph_hash and self.graph_hash != graph.whole().hash:
            raise CollageError("this plan was made for a different model (graph hash mismatch)")

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
    def to_dict(self) -> dict:
        d = asdict(self)
        d["format"] = PLAN_FORMAT
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_dict(d: Mapping) -> "Plan":
        if d.get("format") != PLAN_FORMAT:
            raise CollageError(f"unsupported plan format {d.get('format')!r} (this collage-ml reads {PLAN_FORMAT})")
        parts = [
            Partition(p["backend"], list(p["nodes"]), p.get("predicted_ms"), p.get("measured_ms"),
                      tuple(p["backend_spec"]) if p.get("backend_spec") else None)
            for p in d["partitions"]
        ]
        return Plan(d["model"], parts, d.get("hardware", ""), d.get("threads", 1), d.get("versions", {}),
                    d.get("predicted_ms"), d.get("measured_ms"), d.get("graph_hash", ""))

    @staticmethod
    def from_json(text: str) -> "Plan":
        try:
            return Plan.from_dict(json.loads(text))
        except (KeyError, TypeError, ValueError) as e:
            raise CollageError(f"not a collage-ml plan: {e}") from None

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


def _backend_of(p: Partition) -> Backend:
    if p.backend_spec:
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
        self.report: dict[str, Any] = {}
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
        (d / "plan.json").write_text(self.plan.to_json())
        if self.report:
            (d / "report.json").write_text(json.dumps(self.report, indent=1, default=str))
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


def load(path: str | Path, threads: int | None = None) -> PlacedModel:
    """Loads a PlacedModel saved with :meth:`PlacedModel.save`, recompiling its backends."""
    from collage_ml.ir.importers import from_onnx, load_onnx_file

    d = Path(path)
    if not (d / "plan.json").exists() or not (d / "model.onnx").exists():
        raise ModelError(f"{d}: not a saved placed model (expected plan.json and model.onnx)")
    plan = Plan.from_json((d / "plan.json").read_text())
    graph = from_onnx(load_onnx_file(d / "model.onnx"), name=plan.model)
    pm = plan.compile(graph, threads=threads)
    if (d / "report.json").exists():
        pm.report = json.loads((d / "report.json").read_text())
    return pm
