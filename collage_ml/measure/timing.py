"""Timing and correctness rules for one compiled candidate.

**Timing.** Warm up (at least ``warmup`` calls and ``warmup_seconds``), then
repeat until at least ``min_repeats`` samples are taken and the relative
spread (interquartile range / median) is below ``max_spread``, or until
``time_cap`` seconds or ``max_repeats`` samples. The median and the spread are
recorded, with every sample.

**Correctness.** Outputs are compared with the reference activations with an
allclose-style rule per element, ``|got - want| <= atol_eff + rtol * |want|``,
where ``atol_eff = atol * max(1, max|want|)``: the absolute part scales with
the tensor's largest magnitude, because float32 rounding error accumulates
with it. Correct backends differ from onnxruntime by up to 4.6e-4 on the
whole ResNeXt-50 (outputs up to ~11, rms 1.7), which an rms-scaled bound
rejected. Defaults: ``rtol=1e-3``, ``atol=1e-4``. A candidate outside the
tolerance is invalid; a backend with wrong numbers misses by orders of
magnitude more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = 2
    warmup_seconds: float = 0.02
    min_repeats: int = 5
    max_repeats: int = 200
    max_spread: float = 0.05
    time_cap: float = 2.0


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 1e-3
    atol: float = 1e-4


@dataclass
class TimingResult:
    samples: list[float]
    median: float
    spread: float


def spread_of(samples: Sequence[float]) -> float:
    q25, q50, q75 = np.percentile(samples, [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


def time_callable(fn: Callable[[], Any], cfg: TimingConfig = TimingConfig()) -> TimingResult:
    """Times ``fn()`` by the rules above; each sample is one call, in seconds."""
    clock = time.perf_counter
    start = clock()
    n = 0
    while n < cfg.warmup or clock() - start < cfg.warmup_seconds:
        fn()
        n += 1
        if n >= 10 * max(cfg.warmup, 1) and clock() - start > cfg.warmup_seconds:
            break
    samples: list[float] = []
    begin = clock()
    while True:
        t0 = clock()
        fn()
        samples.append(clock() - t0)
        if len(samples) >= cfg.max_repeats or clock() - begin > cfg.time_cap:
            break
        if len(samples) >= cfg.min_repeats and spread_of(samples) <= cfg.max_spread:
            break
    return TimingResult(samples, float(np.median(samples)), spread_of(samples))


@dataclass
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def compare(
    got: Sequence[np.ndarray], want: Mapping[str, np.ndarray] | Sequence[np.ndarray], names: Sequence[str],
    tol: Tolerance = Tolerance(),
) -> Comparison:
    """Compares outputs with the reference by the rule in the module docstring."""
    wants = [want[n] for n in names] if isinstance(want, Mapping) else list(want)
    if len(got) != len(wants):
        return Comparison(False, float("inf"), float("inf"), f"{len(got)} outputs, expected {len(wants)}")
    max_abs = max_rel = 0.0
    for name, g, w in zip(names, got, wants):
        g = np.asarray(g)
        w = np.asarray(w)
        if g.shape != w.shape:
            return Comparison(False, float("inf"), float("inf"), f"output {name!r} has shape {g.shape}, expected {w.shape}")
        if w.dtype == np.bool_ or np.issubdtype(w.dtype, np.integer):
            if not np.array_equal(g, w):
                return Comparison(False, float("inf"), float("inf"), f"output {name!r} differs (exact dtype {w.dtype})")
            continue
        gf = g.astype(np.float64)
        wf = w.astype(np.float64)
        if not np.all(np.isfinite(gf) == np.isfinite(wf)):
            return Comparison(False, float("inf"), float("inf"), f"output {name!r} has non-finite values where the reference has none")
        finite = np.isfinite(wf)
        diff = np.abs(gf - wf)[finite]
        if diff.size == 0:
            continue
        scale = max(1.0, float(np.abs(wf[finite]).max()))
        bound = tol.atol * scale + tol.rtol * np.abs(wf[finite])
        a = float(diff.max())
        r = float((diff / np.maximum(np.abs(wf[finite]), 1e-12)).max())
        max_abs = max(max_abs, a)
        max_rel = max(max_rel, r)
        if np.any(diff > bound):
            worst = int(np.argmax(diff - bound))
            return Comparison(
                False, max_abs, max_rel,
                f"output {name!r} differs from the reference: max abs error {a:.3g} "
                f"(at {wf[finite].flat[worst]:.4g}), tolerance atol={tol.atol:g}x{scale:.3g} rtol={tol.rtol:g}",
            )
    return Comparison(True, max_abs, max_rel)
