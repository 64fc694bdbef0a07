"""Test fixture: probe results of a synthetic machine whose speeds are known exactly (no measurement)."""

from __future__ import annotations

from collage_ml.featurize.roofline import probe_work

#: FLOP/s per class and bytes/s for memory-bound probes of a plausible 2-core CPU backend
BASE_RATES = {"conv": 4e10, "dw": 5e9, "mm": 5e10, "mem": 2e10}


def fake_probes(overhead: float = 1e-5, scale: float = 1.0, rates: dict | None = None) -> dict[str, float]:
    """{probe name: seconds} of a backend with ``overhead`` seconds per call and every rate times ``scale``."""
    r = {**BASE_RATES, **(rates or {})}
    return {name: overhead + work / (r[cls] * scale) for name, (cls, work) in probe_work().items()}
