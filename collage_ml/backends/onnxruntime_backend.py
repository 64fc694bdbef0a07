"""``onnxruntime``: ONNX Runtime's CPU execution provider, region patterns.

Sessions use their own intra-op pool of ``threads`` threads with spinning
off by default: with spinning on, a chain of sessions each leaves its workers
spinning for ~40 ms after a call, which slows the next partition (15 segment
sessions took 30.5 ms against a 1.75 ms sum, STACK-NOTES.md). ``spin=True``
gives the single-session configuration ORT uses by default.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from collage_ml.backends.base import Backend, Executable, register_backend, to_numpy
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError, first_line
from collage_ml.ir.graph import Graph, Node, SubGraph

ORT_DOMAINS = ("", "ai.onnx", "com.microsoft")


class OrtExecutable(Executable):
    def __init__(self, session, input_names: Sequence[str], output_names: Sequence[str]):
        self.session = session
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._sess_inputs = [i.name for i in session.get_inputs()]
        self._sess_outputs = [o.name for o in session.get_outputs()]

    def __call__(self, *inputs: Any) -> list[Any]:
        feeds = {n: to_numpy(x) for n, x in zip(self._sess_inputs, inputs)}
        return self.session.run(self._sess_outputs, feeds)

    def close(self) -> None:
        self.session = None


def make_session(model_bytes: bytes, threads: int, spin: bool, opt_level: str = "all", providers=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt_level]
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes, so, providers=providers or ["CPUExecutionProvider"])


@register_backend("onnxruntime")
class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    device = "cpu"
    install_hint = "pip install onnxruntime==1.32.0"
    packages = ("onnxruntime",)

    def __init__(self, spin: bool = False, opt_level: str = "all"):
        super().__init__(spin=spin, opt_level=opt_level)
        self.spin = spin
        self.opt_level = opt_level
        self._patterns = (RegionPattern("onnxruntime-region", max_size=16),)

    def _probe(self) -> None:
        import onnxruntime  # noqa: F401

    def _version(self) -> str:
        import onnxruntime as ort

        return f"{ort.__version__}+spin{int(self.spin)}-{self.opt_level}"

    @property
    def patterns(self):
        return self._patterns

    def supports(self, graph: Graph, node: Node) -> bool:
        return node.domain in ORT_DOMAINS

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        try:
            sess = make_session(sg.to_onnx().SerializeToString(), threads, self.spin, self.opt_level)
        except Exception as e:
            raise BackendError(f"onnxruntime could not compile {sg}: {first_line(e)}") from None
        return OrtExecutable(sess, sg.inputs, sg.outputs)
