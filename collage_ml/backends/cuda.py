"""CUDA variants of the backends. They register only when an NVIDIA GPU is present.

* ``torch-cuda``: PyTorch eager on CUDA (cuDNN, cuBLAS), op-level patterns;
* ``inductor-cuda``: ``torch.compile`` with Triton kernels, region patterns;
* ``onnxruntime-cuda`` and ``onnxruntime-tensorrt``: ORT's CUDA and TensorRT
  execution providers, available when the installed onnxruntime has them
  (``pip install onnxruntime-gpu``);
* ``tvm-cuda``: TVM Relax for ``cuda`` with dlight's default GPU schedules.

Every executable synchronises the device before it returns, so timings cover
the kernels and not only their launch. The classes live at module level so
measurement workers can rebuild them from ``Backend.spec()``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any

from collage_ml.backends.base import Executable, register_backend
from collage_ml.backends.inductor_backend import InductorBackend
from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend, OrtExecutable, make_session
from collage_ml.backends.torch_backend import TorchBackend
from collage_ml.backends.tvm_backend import TVMBackend
from collage_ml.errors import BackendError, first_line
from collage_ml.ir.graph import SubGraph


@functools.lru_cache(maxsize=1)
def gpu_present() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU (checked without importing torch)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        r = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


class CudaSync(Executable):
    """Moves inputs to the GPU (no copy when they are there already) and synchronises after the call."""

    def __init__(self, inner: Executable):
        self.inner = inner
        self.input_names = inner.input_names
        self.output_names = inner.output_names

    def __call__(self, *inputs: Any) -> list[Any]:
        import torch

        from collage_ml.backends.onnx_to_torch import to_torch

        outs = self.inner(*[to_torch(x).to("cuda", non_blocking=True) for x in inputs])
        torch.cuda.synchronize()
        return outs

    def close(self) -> None:
        self.inner.close()


def _probe_torch_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device (CPU build of torch, or no driver)")


class TorchCudaBackend(TorchBackend):
    name = "torch-cuda"
    device = "cuda"
    install_hint = "a CUDA build of torch and an NVIDIA driver"

    def _probe(self) -> None:
        super()._probe()
        _probe_torch_cuda()

    def _version(self) -> str:
        import torch

        return f"{torch.__version__}+cuda{torch.version.cuda}"

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        from collage_ml.backends.onnx_to_torch import TorchProgram
        from collage_ml.backends.torch_backend import TorchExecutable

        self.require()
        program = TorchProgram(sg, device="cuda")
        return CudaSync(TorchExecutable(program, program.fn, threads))


class InductorCudaBackend(InductorBackend):
    name = "inductor-cuda"
    device = "cuda"
    install_hint = "a CUDA build of torch with Triton, and an NVIDIA driver"

    def _probe(self) -> None:
        super()._probe()
        _probe_torch_cuda()

    def _version(self) -> str:
        import torch

        return f"{torch.__version__}+cuda{torch.version.cuda}-inductor"

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        return CudaSync(self._compile_on(sg, threads, device="cuda"))


class OrtProviderBackend(OnnxRuntimeBackend):
    """onnxruntime with a GPU execution provider (CPU provider as fallback for unsupported nodes)."""

    provider = ""
    device = "cuda"
    install_hint = "pip install onnxruntime-gpu (instead of onnxruntime)"

    def _probe(self) -> None:
        import onnxruntime as ort

        if self.provider not in ort.get_available_providers():
            raise RuntimeError(f"this onnxruntime build has no {self.provider}")

    def _version(self) -> str:
        return f"{super()._version()}-{self.provider}"

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        try:
            sess = make_session(
                sg.to_onnx().SerializeToString(), threads, self.spin, self.opt_level,
                providers=[self.provider, "CPUExecutionProvider"], pool=getattr(self, "pool", "own"),
                skipln=getattr(self, "skipln", "on"),
            )
        except Exception as e:
            raise BackendError(f"{self.name} could not compile {sg}: {first_line(e)}") from None
        return OrtExecutable(sess, sg.inputs, sg.outputs)


class OrtCudaBackend(OrtProviderBackend):
    name = "onnxruntime-cuda"
    provider = "CUDAExecutionProvider"


class OrtTensorRTBackend(OrtProviderBackend):
    name = "onnxruntime-tensorrt"
    provider = "TensorrtExecutionProvider"


class TVMCudaBackend(TVMBackend):
    name = "tvm-cuda"
    device = "cuda"


CUDA_BACKENDS = (TorchCudaBackend, InductorCudaBackend, OrtCudaBackend, OrtTensorRTBackend, TVMCudaBackend)

if gpu_present():
    for _cls in CUDA_BACKENDS:
        register_backend(_cls.name, _cls)
