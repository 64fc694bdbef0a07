"""A fixture backend with injected per-process latency modes, for the measurement protocol's tests.

``ModedFixture(counter=PATH, fast_us=..., slow_us=...)`` runs onnxruntime, then busy-waits so that each call
takes about ``slow_us`` in the first worker process that compiles with it, ``fast_us`` in the second, slow in
the third, and so on: the per-process modes the protocol must see through (docs/results/noise.md). The process's
index comes from a counter file shared by the workers. Never registered for users.
"""

from __future__ import annotations

import fcntl
import os
import time

from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend

_INDEX: dict[str, int] = {}


def process_index(counter: str) -> int:
    """This process's index among the processes that asked ``counter`` (0, 1, ...), fixed per process."""
    if counter not in _INDEX:
        with open(counter, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            n = len(f.read().split())
            f.write(f"{os.getpid()}\n")
        _INDEX[counter] = n
    return _INDEX[counter]


class _Moded:
    def __init__(self, inner, seconds: float):
        self.inner, self.seconds = inner, seconds
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def __call__(self, *xs):
        end = time.perf_counter() + self.seconds
        out = self.inner(*xs)
        while time.perf_counter() < end:
            pass
        return out

    def close(self):
        self.inner.close()


class ModedFixture(OnnxRuntimeBackend):
    name = "test-moded"

    def __init__(self, counter: str = "", fast_us: float = 200.0, slow_us: float = 400.0, **kw):
        super().__init__(**kw)
        self.config.update(counter=counter, fast_us=fast_us, slow_us=slow_us)
        self.counter, self.fast_us, self.slow_us = counter, fast_us, slow_us

    def _version(self) -> str:
        return "moded-1"

    def compile(self, sg, threads=1):
        slow = process_index(self.counter) % 2 == 0
        return _Moded(super().compile(sg, threads), (self.slow_us if slow else self.fast_us) * 1e-6)


class CountingFixture(OnnxRuntimeBackend):
    """onnxruntime that appends a line to the file ``counter`` at every compile, in whichever process."""

    name = "test-counting"

    def __init__(self, counter: str = "", **kw):
        super().__init__(**kw)
        self.config.update(counter=counter)
        self.counter = counter

    def _version(self) -> str:
        return "counting-1"

    def compile(self, sg, threads=1):
        if self.counter:
            with open(self.counter, "a") as f:
                f.write(f"{os.getpid()}\n")
        return super().compile(sg, threads)


def compiles(counter: str) -> int:
    """How many compiles a :class:`CountingFixture` with this counter file has done."""
    try:
        with open(counter) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


class KeptCount:
    """A worker task: how many compiled candidates the worker keeps (``measure.tasks``' store)."""

    def execute(self) -> dict:
        from collage_ml.measure import tasks

        return {"valid": True, "kept": len(tasks._KEPT)}
