"""``mnn``: Alibaba's MNN inference engine on the CPU, region patterns (opt-in).

A region is exported with :meth:`SubGraph.to_onnx`, converted in-process with
MNN's own ONNX converter (``_tools.mnnconvert``, about 60 ms for a small
region) into a temporary ``.mnn`` file, loaded with
``MNN.nn.load_module_from_file`` on a CPU runtime manager with
``precision=high`` (fp32) and ``threads`` threads, and run through MNN's
expression API.

MNN is **opt-in**. ``benchmarks/kernel_libraries.py`` found one region kind
where it beats the best default backend-configuration by more than 5% within
the fp32 gate (ConvTranspose at batch 16), but no zoo plan that gains from it
end to end (docs/results/placement.md, "More kernel libraries"). Name it explicitly:
``--backends onnxruntime,openvino,mnn``.

Configurations (:attr:`MnnBackend.CONFIGS`, defaults first)::

    mnn[winograd=low|high]

- ``winograd``: MNN's ``WINOGRAD_MEMORY_LEVEL`` hint. ``low`` (level 1) keeps
  to small Winograd tiles, whose fp32 error is within collage-ml's gate
  (rtol 1e-3, atol 1e-4 scaled by the output's magnitude). ``high`` (level 3)
  is MNN's own default: larger tiles, faster 3x3 convolutions, and errors up to
  about 8x the gate on a 64-channel 3x3 convolution, so those candidates are
  measured but rejected as wrong numbers.

``Gelu`` is not offered: MNN computes it with the tanh approximation (errors of
5e-4 on BERT's activations, above the gate). Convolutions and pools run with two
spatial dimensions only (a 3-D convolution fails to load).

Only float32 tensors cross a region's boundary: MNN's converter turns int64
tensors into int32, so regions with integer inputs or outputs are not offered.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
from typing import Any, Iterator

import numpy as np
from collage_ml.backends.base import (
    Backend,
    Executable,
    configured_name,
    float32_boundary_node,
    package_version,
    register_backend,
    require_float32_inputs,
    to_numpy,
)
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError, first_line
from collage_ml.ir.graph import Graph, Node, SubGraph

#: ONNX ops whose MNN conversion a test has run against the reference (tests/test_backend_mnn.py
#: covers every op of the zoo); MNN's converter accepts more
SUPPORTED_OPS = frozenset(
    """Abs Add AveragePool BatchNormalization Clip Concat Conv ConvTranspose Div Elu Exp Flatten
    Gemm GlobalAveragePool GlobalMaxPool HardSigmoid HardSwish Identity LayerNormalization LeakyRelu Log
    MatMul Max MaxPool Min Mul Neg Pad Pow PRelu ReduceMax ReduceMean ReduceMin ReduceSum Relu Reshape
    Sigmoid Slice Softmax Softplus Sqrt Squeeze Sub Tanh Transpose Unsqueeze""".split()
)
#: MNN runs these with two spatial dimensions only (a 3-D Conv fails to load)
_SPATIAL_OPS = frozenset({"Conv", "ConvTranspose", "AveragePool", "MaxPool", "GlobalAveragePool", "GlobalMaxPool"})
#: ops that read their second (or later) inputs as constants; MNN folds them at conversion
_CONST_INPUT_OPS = frozenset({"Reshape", "Slice", "Pad", "Squeeze", "Unsqueeze", "Clip", "ReduceMean",
                               "ReduceSum", "ReduceMax", "ReduceMin"})
#: WINOGRAD_MEMORY_LEVEL is hint 3 in MNN's Interpreter::HintMode
_HINT_WINOGRAD_MEMORY_LEVEL = 3
_WINOGRAD_LEVEL = {"low": 1, "high": 3}


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """MNN prints its converter log and a CPU-feature line straight to fd 1; send them to /dev/null."""
    try:
        fd = os.dup(1)
    except OSError:  # no stdout at all
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            try:
                yield
            finally:
                _c_flush()  # what MNN printed but C stdio still buffers goes to /dev/null too
                os.dup2(fd, 1)
    finally:
        os.close(fd)


def _c_flush() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # pragma: no cover - no libc
        pass


def _import_mnn():
    with _quiet_stdout():
        import MNN.expr as F
        import MNN.nn as nn
    return nn, F


class MnnExecutable(Executable):
    def __init__(self, module, runtime, input_names, output_names):
        _, self._F = _import_mnn()
        self.module = module
        self.runtime = runtime  # keep the runtime manager (and its thread pool) alive with the module
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def __call__(self, *inputs: Any) -> list[Any]:
        F = self._F
        xs = []
        for x in inputs:  # float32 only (MnnBackend.compile checks)
            a = np.ascontiguousarray(to_numpy(x), dtype=np.float32)
            xs.append(F.const(a, list(a.shape), F.NCHW))
        outs = self.module.forward(xs)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        res = []
        for o in outs:
            if o.data_format == F.NC4HW4:
                o = F.convert(o, F.NCHW)
            res.append(np.array(o.read(), copy=True))
        return res

    def close(self) -> None:
        self.module = None
        self.runtime = None


@register_backend("mnn")
class MnnBackend(Backend):
    name = "mnn"
    device = "cpu"
    install_hint = "pip install 'collage-ml[mnn]'  (MNN==3.6.1)"
    packages = ("MNN",)
    CONFIGS = {"winograd": ("low", "high")}

    def __init__(self, winograd: str = "low"):
        super().__init__(winograd=winograd)
        if str(winograd).lower() not in self.CONFIGS["winograd"]:
            raise BackendError(f"mnn: winograd={winograd} is not one of {'|'.join(self.CONFIGS['winograd'])}")
        self.winograd = str(winograd).lower()
        cname = configured_name(type(self).name, self.CONFIGS, self.options())
        if cname != type(self).name:
            self.name = cname
        self._patterns = (RegionPattern("mnn-region", max_size=16),)

    def options(self) -> dict[str, str]:
        return {"winograd": self.winograd}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "MnnBackend":
        return cls(winograd=options["winograd"])

    def _probe(self) -> None:
        _import_mnn()
        with _quiet_stdout():  # importing the converter prints MNN's CPU-feature line
            importlib.import_module("_tools")  # the converter ships in the same wheel

    def _version(self) -> str:
        return f"{package_version('MNN')}+wino{_WINOGRAD_LEVEL[self.winograd]}"

    @property
    def patterns(self):
        return self._patterns

    def supports(self, graph: Graph, node: Node) -> bool:
        if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
            return False
        if node.op_type in _SPATIAL_OPS and len(graph.tensors[node.inputs[0]].shape) != 4:
            return False
        # integer inputs only as constants the converter folds (shapes, axes, pads)
        return float32_boundary_node(graph, node, _CONST_INPUT_OPS)

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        nn, F = _import_mnn()
        import _tools

        require_float32_inputs("mnn", sg)
        try:
            with tempfile.TemporaryDirectory(prefix="collage-mnn-") as tmp:
                src, dst = os.path.join(tmp, "region.onnx"), os.path.join(tmp, "region.mnn")
                with open(src, "wb") as f:
                    f.write(sg.to_onnx().SerializeToString())
                with _quiet_stdout():
                    ok = _tools.mnnconvert(["mnnconvert", "-f", "ONNX", "--modelFile", src, "--MNNModel", dst,
                                            "--bizCode", "collage-ml"])
                if not ok or not os.path.exists(dst):
                    raise BackendError("MNN's converter rejected the region")
                with _quiet_stdout():
                    runtime = nn.create_runtime_manager(({"backend": "CPU", "precision": "high",
                                                          "numThread": int(threads)},))
                    runtime.set_hint(_HINT_WINOGRAD_MEMORY_LEVEL, _WINOGRAD_LEVEL[self.winograd])
                    module = nn.load_module_from_file(dst, list(sg.inputs), list(sg.outputs), runtime_manager=runtime)
        except BackendError as e:
            raise BackendError(f"mnn could not compile {sg}: {e}") from None
        except Exception as e:
            raise BackendError(f"mnn could not compile {sg}: {first_line(e)}") from None
        if module is None:
            raise BackendError(f"mnn could not load {sg}")
        return MnnExecutable(module, runtime, sg.inputs, sg.outputs)
