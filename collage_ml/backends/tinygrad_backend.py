"""``tinygrad``: tinygrad's ONNX runner on its CPU (clang) device, region patterns (opt-in).

A region is exported with :meth:`SubGraph.to_onnx` to a temporary ``.onnx``
file, loaded with ``tinygrad.nn.onnx.OnnxRunner`` and wrapped in
``tinygrad.TinyJit``: the jit captures the region's kernels on its second call
and replays them afterwards. :meth:`TinygradBackend.compile` makes both
warm-up calls, so the first timed call already replays captured kernels. Each
call copies its inputs into fresh float32 tensors and its outputs back out
with ``.numpy()`` (the jit reuses its output buffers between calls). A region
that launches no kernel (a lone ``Reshape``: a view of its input) makes
``TinyJit`` raise "didn't JIT anything!"; it runs unjitted instead.

tinygrad runs on its ``CPU`` device, which compiles the generated C kernels
with clang: ``DEV=CPU`` is set (``os.environ.setdefault``) right before
tinygrad is first imported, never at module import, and a ``clang`` on PATH is
required.

``threads`` is ignored: tinygrad's CPU device picks its own parallelism. Its
knob is the ``NUM_CPU_THREADS`` environment variable (a ``tinygrad.helpers``
ContextVar, read once at import, default: the CPUs this process may use), the
largest number of cores one kernel is split across (scoped override:
``tinygrad.Context(NUM_CPU_THREADS=n)``); it is part of tinygrad's kernel
cache key. This backend does not set it.

tinygrad is **opt-in**: name it explicitly, ``--backends onnxruntime,tinygrad``.
Measured (docs/results/placement.md, "More kernel libraries"): 3-300x slower than the best
default backend-configuration on every region kind of the zoo, so it stays
opt-in.

Only float32 tensors cross a region's boundary; integer tensors may enter a
node only as constants (shapes, axes) at input index 1 or later.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import numpy as np

from collage_ml.backends.base import (
    Backend,
    Executable,
    float32_boundary_node,
    package_version,
    register_backend,
    require_float32_inputs,
    to_numpy,
)
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError, first_line
from collage_ml.ir.graph import Graph, Node, SubGraph

#: ONNX ops whose tinygrad lowering tests/test_backend_tinygrad.py has run against the reference on the
#: zoo's tiny models (resnet50, bert, mobilenetv2); tinygrad's ONNX runner accepts many more
SUPPORTED_OPS = frozenset(
    """Add Clip Conv Gelu Gemm LayerNormalization MatMul MaxPool Mul ReduceMean Relu Reshape Softmax
    Transpose""".split()
)


def _import_tinygrad():
    os.environ.setdefault("DEV", "CPU")
    import tinygrad
    from tinygrad.nn.onnx import OnnxRunner

    return tinygrad, OnnxRunner


class TinygradExecutable(Executable):
    def __init__(self, jitted, input_names, output_names):
        self._tinygrad, _ = _import_tinygrad()
        self._jitted = jitted
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def __call__(self, *inputs: Any) -> list[Any]:
        Tensor = self._tinygrad.Tensor
        feeds = {n: Tensor(np.ascontiguousarray(to_numpy(x), dtype=np.float32)).realize()
                 for n, x in zip(self.input_names, inputs)}
        outs = self._jitted(**feeds)
        return [np.array(o.numpy(), copy=True) for o in outs]

    def close(self) -> None:
        self._jitted = None


@register_backend("tinygrad")
class TinygradBackend(Backend):
    name = "tinygrad"
    device = "cpu"
    install_hint = "pip install tinygrad==0.14.0 and a clang on PATH (apt install clang)"
    packages = ("tinygrad",)
    patterns = (RegionPattern("tinygrad-region", max_size=16),)

    def _probe(self) -> None:
        _import_tinygrad()
        if shutil.which("clang") is None:
            raise RuntimeError("tinygrad's CPU device compiles its kernels with clang, and no clang is on PATH")

    def _version(self) -> str:
        return package_version("tinygrad")

    def supports(self, graph: Graph, node: Node) -> bool:
        if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
            return False
        return float32_boundary_node(graph, node)

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        graph = sg.graph
        require_float32_inputs("tinygrad", sg)
        try:
            tinygrad, OnnxRunner = _import_tinygrad()
            with tempfile.TemporaryDirectory(prefix="collage-tinygrad-") as tmp:
                path = os.path.join(tmp, "region.onnx")
                with open(path, "wb") as f:
                    f.write(sg.to_onnx().SerializeToString())
                runner = OnnxRunner(path)
            outputs = tuple(sg.outputs)

            def run(**feeds):
                res = runner(feeds)
                return [res[n].contiguous().realize() for n in outputs]

            from tinygrad.engine.jit import JitError

            exe = TinygradExecutable(tinygrad.TinyJit(run), sg.inputs, outputs)
            zeros = [np.zeros(graph.tensors[n].shape, dtype=np.float32) for n in sg.inputs]
            try:
                for _ in range(2):  # TinyJit captures on the second call
                    exe(*zeros)
            except JitError:  # no kernel to capture (a lone Reshape is a view of its input): run unjitted
                exe = TinygradExecutable(run, sg.inputs, outputs)
                exe(*zeros)
        except Exception as e:
            raise BackendError(f"tinygrad could not compile {sg}: {first_line(e)}") from None
        return exe
