"""The ``tvm`` backend's runtime: its thread pools and the executable it compiles to.

TVM's runtime thread pool is per calling thread and sized once from
``TVM_NUM_THREADS``. :func:`setup_runtime_env` sets ``TVM_NUM_THREADS`` to the
number of usable cores (unless set) before TVM's runtime starts, and
``TVM_BIND_THREADS=0`` (unless set) so that TVM never pins the calling thread,
whose affinity other runtimes' pools would inherit; :func:`set_threads`
narrows this thread's pool to the executable's ``threads`` before a call.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from collage_ml.backends.base import Executable
from collage_ml.errors import BackendError
from collage_ml.ir.graph import SubGraph


def first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    # TVM errors start with a traceback; the message is on the last line
    for line in reversed(s):
        line = line.strip()
        if line and not line.startswith(("File ", "at ", "^")):
            return f"{type(e).__name__}: {line[:300]}"
    return type(e).__name__


def setup_runtime_env() -> None:
    """Sizes TVM's thread pools; call before TVM's runtime first runs anything."""
    try:
        ncpu = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        ncpu = os.cpu_count() or 1
    os.environ.setdefault("TVM_NUM_THREADS", str(max(1, ncpu)))
    os.environ.setdefault("TVM_BIND_THREADS", "0")


_tls = threading.local()


def set_threads(n: int) -> None:
    """Uses ``n`` workers of this thread's TVM pool (each Python thread has its own pool)."""
    if getattr(_tls, "threads", None) == n:
        return
    import tvm

    # args: affinity mode (1 = kBig, all cores on x86), number of threads
    tvm.get_global_func("runtime.config_threadpool")(1, int(n))
    _tls.threads = n


class TVMExecutable(Executable):
    """A Relax VM function. Inputs: numpy arrays or DLPack tensors; outputs: TVM tensors (DLPack)."""

    def __init__(self, vm, sg: SubGraph, threads: int, info: dict, device=None):
        import tvm

        self._tvm = tvm
        self.device = device if device is not None else tvm.cpu(0)
        self._dev_type = self.device.dlpack_device_type()
        self._gpu = self._dev_type != tvm.cpu(0).dlpack_device_type()
        self._tensor_type = tvm.runtime.Tensor
        self.vm = vm
        self._fn = vm["main"]
        self.input_names = tuple(sg.inputs)
        self.output_names = tuple(sg.outputs)
        self._in_dtypes = [sg.graph.tensors[n].dtype for n in self.input_names]
        self._out_info = [sg.graph.tensors[n] for n in self.output_names]
        self.threads = threads
        #: how it was built: tuned or not, tasks tuned/reused, seconds per phase
        self.info = info

    def _arg(self, x: Any, dtype: np.dtype):
        tvm = self._tvm
        if isinstance(x, np.ndarray) or np.isscalar(x):
            return tvm.runtime.tensor(np.ascontiguousarray(x, dtype=dtype), device=self.device)
        if isinstance(x, self._tensor_type):
            t = x
        elif hasattr(x, "__dlpack__"):  # torch and others: zero-copy (DLPack wants a contiguous tensor)
            if hasattr(x, "is_contiguous") and not x.is_contiguous():
                x = x.contiguous()
            if hasattr(x, "detach"):
                x = x.detach()
            t = tvm.runtime.from_dlpack(x)
        else:
            return tvm.runtime.tensor(np.ascontiguousarray(np.asarray(x), dtype=dtype), device=self.device)
        if t.device.dlpack_device_type() != self._dev_type:  # e.g. a CPU tensor for a GPU executable
            t = t.copyto(self.device)
        return t

    def _out(self, o: Any, info):
        if isinstance(o, self._tensor_type):
            return o
        # a Shape op's static result comes back as a shape tuple; a scalar as a PrimValue
        arr = np.asarray(list(o) if not np.isscalar(o) else o, dtype=info.dtype).reshape(info.shape)
        return self._tvm.runtime.tensor(arr, device=self.device)

    def __call__(self, *inputs: Any) -> list[Any]:
        if self.vm is None:
            raise BackendError("tvm: the executable was closed")
        if len(inputs) != len(self.input_names):
            raise BackendError(f"tvm: expected {len(self.input_names)} inputs {list(self.input_names)}, got {len(inputs)}")
        set_threads(self.threads)
        try:
            args = [self._arg(x, dt) for x, dt in zip(inputs, self._in_dtypes)]
            res = self._fn(*args)
            if self._gpu:  # kernels run asynchronously; a timing must cover them
                self.device.sync()
        except BackendError:
            raise
        except Exception as e:
            raise BackendError(f"tvm: run failed: {first_line(e)}") from None
        # one output comes back bare, several as a tuple (the frontend returns a Tuple only then)
        outs = [res] if isinstance(res, self._tensor_type) or len(self.output_names) == 1 else list(res)
        return [self._out(o, info) for o, info in zip(outs, self._out_info)]

    def close(self) -> None:
        self._fn = None
        self.vm = None
