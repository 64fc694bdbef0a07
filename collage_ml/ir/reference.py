"""Reference activations: the whole model run once on ONNX Runtime, every tensor captured.

DESIGN.md's "reference first": candidates are fed the captured tensors and
their outputs are compared with the captured ones. :func:`seeded_inputs` makes
the seeded inputs (:meth:`Graph.example_inputs`), :func:`run_reference` runs
the model on them (:meth:`Graph.reference`, which caches per seed), and
:func:`run_onnx` is the one ONNX Runtime call both use, with the importer's
shape and constant checks: the CPU provider with optimisations off, its
session options fitted to this process's ORT thread pool
(:mod:`collage_ml.ort_pool`), so a process that made ORT's global pool can
still run references. onnxruntime is imported inside :func:`run_onnx` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np
import onnx

from collage_ml.errors import ModelError
from collage_ml.ort_pool import fit_session_options

if TYPE_CHECKING:
    from collage_ml.ir.graph import Graph


def seeded_inputs(graph: "Graph", seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: standard normal for floats, integers in [0, 10) for ints, coin flips for bools."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.input_names:
        t = graph.tensors[name]
        dt = t.dtype
        if np.issubdtype(dt, np.floating):
            out[name] = rng.standard_normal(t.shape).astype(dt)
        elif dt == np.bool_:
            out[name] = rng.integers(0, 2, t.shape).astype(dt)
        else:
            out[name] = rng.integers(0, 10, t.shape).astype(dt)
    return out


def run_reference(graph: "Graph", feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of ``graph`` run on ``feeds`` (one per graph input), by name, the inputs included."""
    unknown = set(feeds) - set(graph.input_names)
    if unknown:
        raise ModelError(f"unknown input(s) {sorted(unknown)}; the model's inputs are {list(graph.input_names)}")
    absent = [n for n in graph.input_names if n not in feeds]
    if absent:
        raise ModelError(f"missing input(s) {absent}")
    wanted = [t for n in graph.nodes for t in n.outputs if t]
    values = run_onnx(graph.model, feeds, wanted)
    return {**feeds, **values}


def run_onnx(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], outputs: list[str] | None = None
) -> dict[str, np.ndarray]:
    """Runs ``model`` on onnxruntime's CPU provider with optimisations off, returning ``outputs``.

    Tensors not among the graph's outputs are exposed as extra outputs.
    """
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = outputs if outputs is not None else [o.name for o in m.graph.output]
    existing = {o.name for o in m.graph.output}
    for t in names:
        if t not in existing:
            m.graph.output.append(onnx.ValueInfoProto(name=t))
            existing.add(t)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    fit_session_options(so)  # a process that made ORT's global pool may only make sessions that use it
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    res = sess.run(names, dict(feeds))
    return dict(zip(names, res))
