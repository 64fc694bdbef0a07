"""The ``torch`` backend: PyTorch eager library kernels (oneDNN/MKL on CPU).

A SubGraph runs as a :class:`~collage_ml.backends.onnx_to_torch.TorchProgram`:
one torch call per ONNX node, no fusion, so it offers op-level patterns only
(the kernel sequences a library runs back to back, like ``Conv -> Add? -> Relu?``),
plus a single-op pattern for every other op the mapping supports.
"""

from __future__ import annotations

from typing import Any, Sequence

from collage_ml.backends.base import Backend, Executable, register_backend
from collage_ml.backends.patterns import OpPattern, Pattern, step
from collage_ml.ir.graph import Graph, Node, SubGraph

#: the fused-sequence patterns; every other supported op type gets a single-op pattern
_SEQUENCES: tuple[tuple[str, tuple[tuple[str, bool], ...]], ...] = (
    ("torch-conv", (("Conv", False), ("Add", True), ("Relu", True))),
    ("torch-convtranspose", (("ConvTranspose", False), ("Relu", True))),
    ("torch-matmul", (("MatMul", False), ("Add", True))),
    ("torch-gemm", (("Gemm", False), ("Relu", True))),
    ("torch-batchnorm", (("BatchNormalization", False), ("Relu", True))),
)


def torch_op_patterns(prefix: str = "torch") -> tuple[OpPattern, ...]:
    """The op-level patterns over everything the ONNX->torch mapping handles."""
    from collage_ml.backends.onnx_to_torch import SPECS

    pats = [
        OpPattern(name.replace("torch", prefix, 1), tuple(step(op, optional=opt) for op, opt in steps))
        for name, steps in _SEQUENCES
    ]
    leading = {steps[0][0] for _, steps in _SEQUENCES}
    for op in sorted(SPECS):
        if op not in leading:
            pats.append(OpPattern(f"{prefix}-{op.lower()}", (step(op),)))
    return tuple(pats)


def set_threads(threads: int) -> None:
    import torch

    threads = max(1, int(threads))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


class TorchExecutable(Executable):
    """Runs a TorchProgram's function (eager, or compiled) under ``torch.inference_mode()``."""

    def __init__(self, program, fn, threads: int):
        self.program = program
        self._fn = fn
        self.threads = max(1, int(threads))
        self.input_names = program.input_names
        self.output_names = program.output_names

    def __call__(self, *inputs: Any) -> list[Any]:
        import torch

        from collage_ml.backends.onnx_to_torch import to_torch
        from collage_ml.errors import BackendError

        if len(inputs) != len(self.input_names):
            raise BackendError(
                f"expected {len(self.input_names)} input(s) {list(self.input_names)}, got {len(inputs)}"
            )
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        xs = [to_torch(x) for x in inputs]
        with torch.inference_mode():
            outs = self._fn(*xs)
            return [o.contiguous() for o in outs]

    def close(self) -> None:
        self._fn = None
        self.program = None


@register_backend("torch")
class TorchBackend(Backend):
    """PyTorch eager: each node is one ATen call (oneDNN convolutions, MKL GEMMs)."""

    name = "torch"
    device = "cpu"
    install_hint = "pip install torch==2.13.0"
    packages = ("torch",)

    def __init__(self) -> None:
        super().__init__()
        self._patterns: tuple[Pattern, ...] | None = None

    def _probe(self) -> None:
        import torch  # noqa: F401

        from collage_ml.backends import onnx_to_torch  # noqa: F401

    def _version(self) -> str:
        import torch

        return str(torch.__version__)

    @property
    def patterns(self) -> Sequence[Pattern]:
        if self._patterns is None:
            self._patterns = torch_op_patterns("torch")
        return self._patterns

    def supports(self, graph: Graph, node: Node) -> bool:
        from collage_ml.backends.onnx_to_torch import supported

        return supported(graph, node)

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        from collage_ml.backends.onnx_to_torch import TorchProgram

        set_threads(threads)
        program = TorchProgram(sg)  # raises BackendError for an unsupported node
        return TorchExecutable(program, program.fn, threads)
