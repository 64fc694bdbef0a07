"""Costs and measurements: the values the measurement harness produces and the search consumes.

A :class:`Cost` is a latency in seconds, or ``unknown`` (not measured yet), or
``invalid`` (the backend failed, or its numbers were wrong). It is never a bare
float: 0 and NaN are not costs.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class Cost:
    """``kind`` is "value", "unknown" or "invalid"; ``seconds`` is set only for "value"."""

    kind: str
    seconds: float = math.nan

    @staticmethod
    def value(seconds: float) -> "Cost":
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"a cost value must be a finite number of seconds >= 0, got {seconds!r}")
        return Cost("value", float(seconds))

    @staticmethod
    def unknown() -> "Cost":
        return Cost("unknown")

    @staticmethod
    def invalid() -> "Cost":
        return Cost("invalid")

    @property
    def is_value(self) -> bool:
        return self.kind == "value"

    @property
    def is_invalid(self) -> bool:
        return self.kind == "invalid"

    @property
    def is_unknown(self) -> bool:
        return self.kind == "unknown"

    def __add__(self, other: "Cost") -> "Cost":
        """invalid dominates unknown, which dominates values."""
        if self.is_invalid or other.is_invalid:
            return Cost.invalid()
        if self.is_unknown or other.is_unknown:
            return Cost.unknown()
        return Cost.value(self.seconds + other.seconds)

    def __str__(self) -> str:
        return f"{self.seconds * 1e3:.4g} ms" if self.is_value else self.kind


#: the measurement protocol's name and version (``measure.timing`` documents it). It is stored with every
#: measurement and is part of the database key, so rows timed another way keep their own key.
PROTOCOL = "m5"
#: a ``failed`` measurement (timeout, crash, kill: a fact about one run) is retried up to this many attempts
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class CandidateKey:
    """What identifies a measurement, together with the hardware fingerprint."""

    subgraph_hash: str
    backend: str
    backend_version: str


@dataclass
class Measurement:
    """One measured (or failed) candidate on one machine.

    ``samples`` are per-run latencies in seconds. ``error`` is the max
    relative/absolute deviation from the reference that was observed (see
    ``measure.timing.compare``). A measurement that is not valid has no latency and an ``error_text``, and is
    one of two kinds: **invalid** (wrong numbers, unsupported, compile error: a fact about the backend, kept as
    data) or **failed** (``failed=True``: timeout, crash, killed: a fact about one run, retried by later runs up
    to :data:`MAX_ATTEMPTS` attempts). ``protocol`` names the measurement protocol it was timed under.
    """

    key: CandidateKey
    hardware: str  # fingerprint id (measure.hardware)
    valid: bool
    samples: list[float] = field(default_factory=list)
    median: float | None = None
    spread: float | None = None  # (p75 - p25) / median
    compile_seconds: float | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    threads: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    family: str = ""
    error_text: str = ""
    onnx_bytes: bytes | None = field(default=None, repr=False)
    timestamp: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    protocol: str = PROTOCOL
    attempts: int = 1

    @property
    def status(self) -> str:
        """"valid", "invalid" or "failed"."""
        return "valid" if self.valid else ("failed" if self.failed else "invalid")

    @property
    def contended(self) -> bool:
        """Timed while something else used the CPUs (``extra["contended"]``): kept, but not clean."""
        return bool(self.extra.get("contended"))

    @property
    def retryable(self) -> bool:
        """A failed or contended measurement that has attempts left: a later run measures it again."""
        return (self.status == "failed" or (self.valid and self.contended)) and self.attempts < MAX_ATTEMPTS

    @property
    def cost(self) -> Cost:
        return Cost.value(self.median) if self.valid and self.median is not None else Cost.invalid()

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("onnx_bytes")
        return d
