"""Placed models: a compiled :class:`~collage_ml.plan.Plan`, and its folder on disk.

:func:`compile_plan` (what :meth:`Plan.compile` calls) validates a plan
against its graph, merges adjacent partitions on the same region backend
whenever their union is convex (:meth:`Plan.merged`), and returns a
:class:`PlacedModel`, which compiles each partition on its backend, runs the
partitions in topological order and hands tensors between backends without
copies (numpy arrays, torch tensors and TVM tensors all speak DLPack on the
CPU). Before compiling, every backend checks that it can share the process
with the others (:meth:`Backend.check_process_compatible`).

:meth:`PlacedModel.save` writes ``model.onnx``, ``plan.json`` and the report;
:func:`load` reads them back as data (see :mod:`collage_ml.plan`): every
backend by its registered name, and ``model.onnx`` checked against the
SHA-256 the plan records, so swapped weights are refused instead of run.

Timing a placed model end to end is the measurement layer's business
(:mod:`collage_ml.measure.e2e`, or :func:`collage_ml.measure.timing.time_callable`
on :meth:`PlacedModel.run`); this module sits in the plan's layer, below it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from collage_ml.backends.base import Executable, to_numpy
from collage_ml.errors import BackendError, ModelError, PlanError, first_line
from collage_ml.ir.graph import Graph
from collage_ml.plan import Plan


def compile_plan(plan: Plan, graph: Graph, threads: int | None = None, merge: bool = True) -> "PlacedModel":
    """``plan`` compiled for ``graph`` with ``threads`` (None: the plan's); ``merge`` merges adjacent
    partitions on the same region backend first."""
    plan.validate(graph)
    if merge:
        region = {p.backend for p in plan.partitions if p.is_region()}
        plan = plan.merged(graph, region)
    return PlacedModel(graph, plan, threads or plan.threads)


class PlacedModel:
    """A compiled plan: call it like the model (numpy arrays or torch tensors, positional or by name)."""

    def __init__(self, graph: Graph, plan: Plan, threads: int = 1):
        self.graph = graph
        self.plan = plan
        self.threads = threads
        self.report: Mapping[str, Any] = {}  # place sets a PlaceReport; a loaded model, the JSON object
        order = plan.execution_order(graph)
        self._steps: list[tuple[Executable, tuple[str, ...], tuple[str, ...]]] = []
        backends = {k: plan.partitions[k].resolve_backend() for k in order}
        together = list(backends.values())
        for b in together:  # e.g. ORT's shared and own pools cannot meet in one process
            b.check_process_compatible(together)
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
                p.resolve_backend()
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
