"""Deliberately broken backends: test fixtures, never registered for users.

Each wraps onnxruntime and breaks one thing: the numbers, the process, or
the clock. Workers rebuild them from ``Backend.spec()``, so they live in an
importable module.
"""

from __future__ import annotations

import os
import time

import numpy as np

from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend


class _Wrap:
    def __init__(self, inner, fn):
        self.inner = inner
        self.fn = fn
        self.input_names = inner.input_names
        self.output_names = inner.output_names

    def __call__(self, *xs):
        return self.fn(self.inner(*xs))

    def close(self):
        self.inner.close()


class WrongNumbersFixture(OnnxRuntimeBackend):
    name = "test-wrong-numbers"

    def compile(self, sg, threads=1):
        return _Wrap(super().compile(sg, threads), lambda outs: [np.asarray(o) + 1.0 for o in outs])


class AbortFixture(OnnxRuntimeBackend):
    name = "test-abort"

    def compile(self, sg, threads=1):
        os.abort()


class HangFixture(OnnxRuntimeBackend):
    name = "test-hang"

    def compile(self, sg, threads=1):
        def hang(outs):
            time.sleep(3600)
            return outs

        return _Wrap(super().compile(sg, threads), hang)


class RaiseFixture(OnnxRuntimeBackend):
    name = "test-raise"

    def compile(self, sg, threads=1):
        raise RuntimeError("this backend always fails to compile")


class FakeCostBackend(OnnxRuntimeBackend):
    """A named region backend for search tests: runs on onnxruntime, costs come from a test's table."""

    def __init__(self, name: str = "fake-a", spin: bool = False, opt_level: str = "all"):
        super().__init__(spin=spin, opt_level=opt_level)
        self.name = name
        self.config["name"] = name

    def _version(self) -> str:
        return "fake-1"


class SlightlyWrongFixture(OnnxRuntimeBackend):
    """Numbers off by 1e-2 relative: ten times the checker's rtol, far from the gross +1.0 above."""

    name = "test-slightly-wrong"

    def compile(self, sg, threads=1):
        return _Wrap(super().compile(sg, threads),
                     lambda outs: [(np.asarray(o) * (1 + 1e-2)).astype(np.asarray(o).dtype) for o in outs])

    def _version(self) -> str:
        return "slightly-wrong-1+" + super()._version()


class SlowFixture(OnnxRuntimeBackend):
    """onnxruntime plus 2 ms of busy waiting per call: a plan on it is slower by a known amount."""

    name = "test-slow"
    DELAY = 2e-3

    def compile(self, sg, threads=1):
        def slow(outs):
            end = time.perf_counter() + self.DELAY
            while time.perf_counter() < end:
                pass
            return outs

        return _Wrap(super().compile(sg, threads), slow)
