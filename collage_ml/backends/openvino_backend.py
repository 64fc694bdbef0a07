"""``openvino``: the OpenVINO CPU plugin, region patterns (an optional extra).

Compiled with ``PERFORMANCE_HINT=LATENCY``, one stream, ``threads`` inference
threads and f32 precision (so bf16-capable CPUs do not change the numbers).
OpenVINO converts its blocked layouts back to NCHW at every output, so it is
measured on regions rather than single nodes (STACK-NOTES.md).

Configurations (:attr:`OpenVinoBackend.CONFIGS`, defaults first)::

    openvino[hint=latency|throughput, streams=1|2|auto, pin=on|off]

- ``hint``: ``PERFORMANCE_HINT``. An explicit ``streams`` overrides the
  stream count the hint would pick, so ``hint=throughput`` matters mostly
  with ``streams=auto`` (on 2 cores it then picks 2 streams).
- ``streams``: ``NUM_STREAMS``; ``auto`` leaves it to the hint. A single
  synchronous request runs on one stream, so with 2 streams it gets
  ``threads / 2`` threads (less sync overhead, less parallelism).
- ``pin``: ``ENABLE_CPU_PINNING``; ``on`` leaves OpenVINO's default (pinning
  on), ``off`` lets the OS move the threads, which can help on a shared CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collage_ml.backends.base import Backend, Executable, configured_name, probe_op, register_backend, to_numpy
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError, first_line
from collage_ml.ir.graph import Graph, Node, SubGraph

# ONNX ops OpenVINO's ONNX frontend converts (the subset collage-ml relies on; the
# frontend supports more, but an op is only listed here once a test has run it)
SUPPORTED_OPS = frozenset(
    """Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast Ceil Clip Concat Conv ConvTranspose
    Cos DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand Flatten Floor Gather GatherElements Gelu
    Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual HardSigmoid HardSwish Identity
    InstanceNormalization LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax LRN MatMul Max MaxPool
    Mean Min Mish Mod Mul Neg Not Or Pad Pow PRelu Range Reciprocal ReduceL2 ReduceMax ReduceMean ReduceMin
    ReduceProd ReduceSum Relu Reshape Resize Round Selu Shape Sigmoid Sign Sin Size Slice Softmax Softplus
    SpaceToDepth Split Sqrt Squeeze Sub Sum Tanh Tile TopK Transpose Unsqueeze Upsample Where Xor""".split()
)


#: outputs of at least this many bytes in all are written in place rather than copied out
ZERO_COPY_MIN_BYTES = 128 * 1024


class OpenVinoExecutable(Executable):
    def __init__(self, compiled, input_names, output_names):
        import openvino as ov

        self._ov = ov
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._outputs = list(compiled.outputs)
        # Large static outputs are written straight into a fresh array per call (OpenVINO uses a
        # user-set output tensor as its output memory); small ones are copied out of the request's
        # buffer, which the next call reuses. Copying costs up to a few ms per call on batch-16
        # activations; setting output tensors costs 2-25 us per call, more than copying a few KB
        # (benchmarks/openvino_output_copy.py).
        self._out_specs = None
        if all(o.get_partial_shape().is_static for o in self._outputs):
            specs = [(tuple(o.get_shape()), o.get_element_type().to_dtype()) for o in self._outputs]
            if sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in specs) >= ZERO_COPY_MIN_BYTES:
                self._out_specs = specs

    def __call__(self, *inputs: Any) -> list[Any]:
        ov = self._ov
        for i, x in enumerate(inputs):
            a = np.ascontiguousarray(to_numpy(x))
            self.request.set_input_tensor(i, ov.Tensor(a, shared_memory=True))
        if self._out_specs is not None:
            outs = [np.empty(shape, dtype) for shape, dtype in self._out_specs]
            for i, o in enumerate(outs):
                self.request.set_output_tensor(i, ov.Tensor(o, shared_memory=True))
            self.request.infer()
            return outs
        self.request.infer()
        return [np.array(self.request.get_output_tensor(i).data, copy=True) for i in range(len(self._outputs))]

    def close(self) -> None:
        self.request = None
        self.compiled = None


@register_backend("openvino")
class OpenVinoBackend(Backend):
    name = "openvino"
    device = "cpu"
    install_hint = "pip install 'collage-ml[openvino]'  (openvino==2026.4.1)"
    packages = ("openvino",)
    CONFIGS = {
        "hint": ("latency", "throughput"),
        "streams": ("1", "2", "auto"),
        "pin": ("on", "off"),
    }

    def __init__(self, hint: str = "LATENCY", streams: int | str = 1, pin: bool = True):
        cfg: dict = {"hint": hint, "streams": streams}
        if not pin:  # only when not the default, so specs stored before pin existed still rebuild
            cfg["pin"] = pin
        super().__init__(**cfg)
        if str(hint).lower() not in self.CONFIGS["hint"]:
            raise BackendError(f"openvino: hint={hint} is not one of {'|'.join(self.CONFIGS['hint'])}")
        if str(streams).lower() not in self.CONFIGS["streams"]:
            raise BackendError(f"openvino: streams={streams} is not one of {'|'.join(self.CONFIGS['streams'])}")
        self.hint = str(hint).upper()
        self.streams: int | str = "auto" if str(streams).lower() == "auto" else int(streams)
        self.pin = bool(pin)
        cname = configured_name(type(self).name, self.CONFIGS, self.options())
        if cname != type(self).name:  # the all-defaults configuration keeps the class's name
            self.name = cname
        self._patterns = (RegionPattern("openvino-region", max_size=16),)
        self._core = None

    def options(self) -> dict[str, str]:
        return {"hint": self.hint.lower(), "streams": str(self.streams), "pin": "on" if self.pin else "off"}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "OpenVinoBackend":
        streams = options["streams"]
        return cls(hint=options["hint"].upper(), streams=streams if streams == "auto" else int(streams),
                   pin=options["pin"] == "on")

    def _probe(self) -> None:
        import openvino  # noqa: F401

    def _version(self) -> str:
        import openvino as ov

        v = f"{ov.__version__.split('-')[0]}+{self.hint.lower()}-s{self.streams}"
        v = v if self.pin else v + "-pin0"
        # "-zc2": outputs of 128 KiB or more written straight into the caller's arrays (no copy out of
        # the request); timings from before (up to 1.6x slower on large memory-bound kernels) and from
        # the first version ("-zc", in place for every size: 2-25 us slower on tiny kernels) keep their keys
        return v + "-zc2"

    @property
    def core(self):
        if self._core is None:
            import openvino as ov

            self._core = ov.Core()
        return self._core

    @property
    def patterns(self):
        return self._patterns

    def supports(self, graph: Graph, node: Node) -> bool:
        if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
            return False
        # OpenVINO has no f64 CPU kernels for most ops; keep to the dtypes the zoo uses
        if not all(graph.tensors[t].elem_type in (1, 6, 7, 9) for t in node.outputs if t):
            return False
        # an op (attributes, dtypes, opset) OpenVINO's ONNX frontend or CPU plugin rejects is declined once
        return probe_op(self, graph, node) is None

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        try:
            model = self.core.read_model(model=sg.to_onnx().SerializeToString())
            props = {
                "INFERENCE_NUM_THREADS": int(threads),
                "PERFORMANCE_HINT": self.hint,
                "INFERENCE_PRECISION_HINT": "f32",
            }
            if self.streams != "auto":
                props["NUM_STREAMS"] = int(self.streams)
            if not self.pin:
                props["ENABLE_CPU_PINNING"] = False
            compiled = self.core.compile_model(model, "CPU", props)
        except Exception as e:
            raise BackendError(f"openvino could not compile {sg}: {first_line(e)}") from None
        # inputs are fed by position, in the model's declared order; a port can carry several names (an
        # input passed straight through, e.g. by Dropout or Identity, may carry only the next tensor's name)
        ports = [set(o.get_names()) for o in compiled.inputs]
        ins = set(sg.inputs)
        if len(ports) != len(sg.inputs) or any(t not in p and p & ins for t, p in zip(sg.inputs, ports)):
            names = [sorted(p) for p in ports]
            raise BackendError(f"openvino renamed the inputs of {sg}: {names} vs {list(sg.inputs)}")
        return OpenVinoExecutable(compiled, sg.inputs, sg.outputs)
