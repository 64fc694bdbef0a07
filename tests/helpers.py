"""Small builders shared by the tests."""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def chain_model(names: dict[str, str] | None = None, width: int = 8, seed: int = 0, order=None) -> onnx.ModelProto:
    """x[1,width] -> MatMul(W) -> Relu -> Add(b) -> two branches (Sigmoid, Tanh) -> Mul -> y.

    ``names`` renames tensors and nodes; ``order`` permutes the node list.
    """
    n = {k: k for k in ["x", "W", "b", "mm", "r", "a", "s", "t", "y"]}
    n.update(names or {})
    rs = np.random.default_rng(seed)
    W = numpy_helper.from_array(rs.standard_normal((width, width)).astype(np.float32), n["W"])
    b = numpy_helper.from_array(rs.standard_normal((width,)).astype(np.float32), n["b"])
    nodes = [
        helper.make_node("MatMul", [n["x"], n["W"]], [n["mm"]], name=n["mm"] + "_node"),
        helper.make_node("Relu", [n["mm"]], [n["r"]], name=n["r"] + "_node"),
        helper.make_node("Add", [n["r"], n["b"]], [n["a"]], name=n["a"] + "_node"),
        helper.make_node("Sigmoid", [n["a"]], [n["s"]], name=n["s"] + "_node"),
        helper.make_node("Tanh", [n["a"]], [n["t"]], name=n["t"] + "_node"),
        helper.make_node("Mul", [n["s"], n["t"]], [n["y"]], name=n["y"] + "_node"),
    ]
    if order is not None:
        nodes = [nodes[i] for i in order]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info(n["x"], TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(n["y"], TensorProto.FLOAT, [1, width])],
        initializer=[W, b],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def random_convex_masks(graph, count: int, max_size: int, seed: int = 0) -> list[int]:
    """Random connected convex node sets grown from random seeds."""
    r = random.Random(seed)
    n = len(graph.nodes)
    out = []
    for _ in range(count * 4):
        if len(out) >= count:
            break
        start = r.randrange(n)
        mask = 1 << start
        size = r.randint(1, max_size)
        for _ in range(size * 3):
            if bin(mask).count("1") >= size:
                break
            members = [i for i in range(n) if mask >> i & 1]
            nb = [j for i in members for j in list(graph.preds[i]) + list(graph.succs[i]) if not mask >> j & 1]
            if not nb:
                break
            j = r.choice(nb)
            if graph.is_convex(mask | 1 << j):
                mask |= 1 << j
        out.append(mask)
    return out


def assert_compiled_matches_reference(backend, graph, ref, mask: int, threads: int, label: str) -> None:
    """Compiles ``graph.subgraph(mask)`` on ``backend``, runs it on the reference inputs, and checks its outputs."""
    from collage_ml.backends.base import to_numpy
    from collage_ml.measure.timing import compare

    sg = graph.subgraph(mask)
    exe = backend.compile(sg, threads=threads)
    feeds, expected = sg.reference_io(ref)
    outs = [to_numpy(o) for o in exe(*[feeds[n] for n in exe.input_names])]
    cmp = compare(outs, expected, list(exe.output_names))
    assert cmp.ok, f"{label} {sg}: {cmp.detail}"


def residual_layernorm_model(variant: str = "residual", d: int = 64) -> onnx.ModelProto:
    """Add(s) then LayerNormalization over [2, 8, d], the pattern ONNX Runtime fuses to SkipLayerNormalization.

    ``variant``: ``residual`` (x + y, fused), ``bias-first`` ((x + b) + y, fused with the bias),
    ``bias-last`` ((x + y) + b, the Add before LN adds a constant: not fused), ``sum-out`` (x + y, the sum
    also an output of the graph: not fused).
    """
    rng = np.random.default_rng(0)
    names = ("gamma", "beta", "b") if variant.startswith("bias") else ("gamma", "beta")
    inits = [numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), n) for n in names]
    outs, nodes = ["out"], []
    if variant in ("residual", "sum-out"):
        nodes.append(helper.make_node("Add", ["x", "y"], ["s"]))
    elif variant == "bias-first":
        nodes += [helper.make_node("Add", ["x", "b"], ["xb"]), helper.make_node("Add", ["xb", "y"], ["s"])]
    elif variant == "bias-last":
        nodes += [helper.make_node("Add", ["x", "y"], ["xy"]), helper.make_node("Add", ["xy", "b"], ["s"])]
    else:
        raise ValueError(f"unknown variant {variant!r}")
    if variant == "sum-out":
        outs.append("s")
    nodes.append(helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["out"], axis=-1, epsilon=1e-5))
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8, d]) for n in ("x", "y", *outs)]
    graph = helper.make_graph(nodes, variant, vi[:2], vi[2:], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ort_optimized_ops(model: onnx.ModelProto, tmp_path, opt_level: str = "all", skipln: str = "on") -> list[str]:
    """The op types, sorted, of the graph onnxruntime optimises ``model`` to under this project's session
    options (``make_session``) with that optimisation level and ``skipln``: the oracle for what ORT fuses."""
    from collage_ml.backends.onnxruntime_backend import make_session

    path = str(tmp_path / f"opt-{opt_level}-{skipln}.onnx")
    make_session(model.SerializeToString(), 1, False, opt_level, skipln=skipln, optimized_path=path)
    return sorted(n.op_type for n in onnx.load(path).graph.node)


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (benchmarks/ is not a package); its parts are tested, not its runs."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
