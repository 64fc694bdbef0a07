"""The ``inductor`` backend: TorchInductor (``torch.compile``) on CPU.

A region runs as the :class:`~collage_ml.backends.onnx_to_torch.TorchProgram`
of the ``torch`` backend, compiled with ``torch.compile(backend="inductor",
dynamic=False, fullgraph=True)`` and Inductor's *freezing* (weights become
constants: folded, and convolution/linear weights prepacked for oneDNN), which
is what makes Inductor competitive on CPU. Inductor fuses, so the backend
offers region patterns.

Compilation happens in :meth:`InductorBackend.compile`: one warm-up call on
random inputs of the region's shapes and dtypes pays the compile cost there,
not in the first timed call. Compiled kernels are cached on disk by Inductor
under ``$TORCHINDUCTOR_CACHE_DIR``, which defaults here to
``<collage-ml cache>/inductor`` when unset.

Options measured (torch 2.13, CPU, 1 thread): freezing matters (full
resnet50: eager ~105 ms, Inductor without freezing ~106-114 ms, with freezing
~80 ms; mobilenetv2 13.4 -> 10.8 ms) and does not slow compilation. Freezing
only applies to a module's parameters and buffers, hence
:meth:`TorchProgram.module`. ``max_autotune`` (what
``mode="max-autotune-no-cudagraphs"`` turns on for CPU) gave neither faster
kernels nor clearly slower compiles on the zoo's regions, so the default
mode is used; ``reduce-overhead`` only matters with CUDA graphs.
"""

from __future__ import annotations

import os
from typing import Sequence

from collage_ml.backends.base import Backend, Executable, register_backend
from collage_ml.backends.patterns import Pattern, RegionPattern
from collage_ml.backends.torch_backend import TorchExecutable, set_threads
from collage_ml.errors import BackendError
from collage_ml.ir.graph import Graph, Node, SubGraph

#: the largest region the backend offers (the whole supported model is always offered too)
MAX_REGION_SIZE = 16
#: Inductor config patches used for every compile
INDUCTOR_OPTIONS = {"freezing": True}


def ensure_cache_dir() -> None:
    """Points Inductor's on-disk cache into collage-ml's cache unless the user chose one.

    Importing ``torch._inductor.config`` (the ONNX exporter does) makes torch
    write its default (``/tmp/torchinductor_<user>``) into the environment, so
    that value counts as unset too.
    """
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current:
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            if os.path.abspath(current) != os.path.abspath(default_cache_dir()):
                return
        except Exception:  # a torch without that helper: respect whatever is set
            return
    from collage_ml.paths import cache_dir

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str((cache_dir() / "inductor").absolute())


@register_backend("inductor")
class InductorBackend(Backend):
    """TorchInductor: fused C++/OpenMP kernels plus oneDNN/MKL for convolutions and GEMMs."""

    name = "inductor"
    device = "cpu"
    install_hint = "pip install torch==2.13.0"
    packages = ("torch",)

    def __init__(self, max_region_size: int = MAX_REGION_SIZE) -> None:
        super().__init__(max_region_size=max_region_size)
        self._patterns: tuple[Pattern, ...] = (RegionPattern("inductor-region", max_size=max_region_size),)

    def _probe(self) -> None:
        import torch

        from collage_ml.backends import onnx_to_torch  # noqa: F401

        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile")

    def _version(self) -> str:
        import torch

        return f"{torch.__version__}+inductor" + ("-freezing" if INDUCTOR_OPTIONS.get("freezing") else "")

    @property
    def patterns(self) -> Sequence[Pattern]:
        return self._patterns

    def supports(self, graph: Graph, node: Node) -> bool:
        from collage_ml.backends.onnx_to_torch import supported

        return supported(graph, node)

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        return self._compile_on(sg, threads, device="cpu")

    def _compile_on(self, sg: SubGraph, threads: int, device: str = "cpu") -> TorchExecutable:
        """Compiles ``sg`` for ``device`` and runs it once, so the compile cost is paid here."""
        import torch

        from collage_ml.backends.onnx_to_torch import TorchProgram

        ensure_cache_dir()
        # Inductor's C++ kernels specialise on the thread count at compile time
        set_threads(threads)
        program = TorchProgram(sg, device=device)  # raises BackendError for an unsupported node
        try:
            compiled = torch.compile(
                program.module(),
                backend="inductor",
                dynamic=False,
                fullgraph=True,
                options=dict(INDUCTOR_OPTIONS),
            )
            with torch.inference_mode():
                compiled(*program.example_inputs())
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise BackendError(f"inductor failed to compile {sg!r}: {type(e).__name__}: {first}") from e
        return TorchExecutable(program, compiled, threads)
