"""What a collection did: :class:`CollectSummary` (its JSON is ``collect --json``) and its table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from collage_ml.collector.sharding import DEFAULT_INDUCTOR_FRACTION, _subsampled_backend
from collage_ml.defaults import MAX_REGION_SIZE

def _new_backend_counts() -> dict[str, int]:
    return {"candidates": 0, "planned": 0, "measured": 0, "valid": 0, "invalid": 0, "cache_hits": 0, "subsampled": 0}


@dataclass
class CollectSummary:
    """What a collection did. ``cache_hits`` counts candidates skipped because the database held them already.

    ``by_backend[name]`` has ``candidates`` (in this shard), ``subsampled`` (left out by
    ``inductor_fraction``), ``cache_hits``, ``planned`` (to measure), ``measured``, ``valid`` and
    ``invalid``; ``by_family[family]`` has ``measured``, ``valid`` and ``invalid``. ``stopped`` is
    ``complete``, ``budget``, ``max_candidates``, ``interrupted`` or ``dry-run``. ``remaining`` is
    what was planned but not measured. Sources are planned one at a time as the run reaches them
    (except for the focus sampler and dry runs), so a run that stops early has ``unplanned_sources``
    (model and batch pairs) whose candidates no count includes yet. ``calibrations`` counts the times the run
    measured the probe set (on every backend that needed it), in ``calibrate_s`` seconds of ``measure_s``.
    ``rate_per_min`` is measurements per minute of the measuring phase less its calibrations (``measure_s``:
    with sources planned as the run reaches them, their planning too); ``elapsed_s`` is the whole run.
    """

    db: str = ""
    hardware: str = ""
    sampler: str = "enumerate"
    models: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    shard: str | None = None
    seed: int = 0
    threads: int = 1
    max_region_size: int = MAX_REGION_SIZE
    inductor_fraction: float = DEFAULT_INDUCTOR_FRACTION
    candidates: int = 0
    planned: int = 0
    measured: int = 0
    cache_hits: int = 0
    subsampled: int = 0
    valid: int = 0
    invalid: int = 0
    remaining: int = 0
    unplanned_sources: int = 0
    by_backend: dict[str, dict[str, int]] = field(default_factory=dict)
    by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    model_updates: int = 0  # focus sampler: cost-model updates from this run's measurements
    calibrations: int = 0  # times this run measured the probe set (on every backend that needed it)
    calibrate_s: float = 0.0  # the seconds they took (part of measure_s)
    skipped: list[str] = field(default_factory=list)
    stopped: str = "complete"
    elapsed_s: float = 0.0
    measure_s: float = 0.0

    @property
    def skipped_known(self) -> int:
        """Alias of ``cache_hits``."""
        return self.cache_hits

    @property
    def rate_per_min(self) -> float:
        busy = self.measure_s - self.calibrate_s
        return self.measured / busy * 60 if busy > 0 else 0.0

    @property
    def invalid_by_backend(self) -> dict[str, int]:
        return {b: c["invalid"] for b, c in self.by_backend.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rate_per_min"] = round(self.rate_per_min, 2)
        d["invalid_by_backend"] = self.invalid_by_backend
        d["elapsed_s"] = round(self.elapsed_s, 3)
        d["measure_s"] = round(self.measure_s, 3)
        d["calibrate_s"] = round(self.calibrate_s, 3)
        return d

    def _hit(self, backend: str) -> None:
        """A planned candidate found in the database when its turn came (another process, or the probe set,
        measured it meanwhile)."""
        self.cache_hits += 1
        self.by_backend.setdefault(backend, _new_backend_counts())["cache_hits"] += 1

    def _record(self, backend: str, family: str, valid: bool) -> None:
        self.measured += 1
        b = self.by_backend.setdefault(backend, _new_backend_counts())
        f = self.by_family.setdefault(family, {"measured": 0, "valid": 0, "invalid": 0})
        b["measured"] += 1
        f["measured"] += 1
        which = "valid" if valid else "invalid"
        b[which] += 1
        f[which] += 1
        if valid:
            self.valid += 1
        else:
            self.invalid += 1

    @staticmethod
    def combine(parts: Sequence["CollectSummary"], **override: Any) -> "CollectSummary":
        """Sums the counts of shard summaries (e.g. the Ray tasks'); the settings come from the first."""
        if not parts:
            return CollectSummary(**override)
        out = CollectSummary(**{**asdict(parts[0]), "by_backend": {}, "by_family": {}, "skipped": []})
        for k in ("candidates", "planned", "measured", "cache_hits", "subsampled", "valid", "invalid", "remaining",
                  "unplanned_sources", "calibrations"):
            setattr(out, k, sum(getattr(p, k) for p in parts))
        for p in parts:
            for b, c in p.by_backend.items():
                t = out.by_backend.setdefault(b, _new_backend_counts())
                for k, v in c.items():
                    t[k] = t.get(k, 0) + v
            for f, c in p.by_family.items():
                t = out.by_family.setdefault(f, {"measured": 0, "valid": 0, "invalid": 0})
                for k, v in c.items():
                    t[k] = t.get(k, 0) + v
            out.skipped.extend(p.skipped)
        stops = {p.stopped for p in parts}
        out.stopped = "complete" if stops == {"complete"} else next(s for s in [p.stopped for p in parts] if s != "complete")
        out.measure_s = max(p.measure_s for p in parts)
        out.calibrate_s = max(p.calibrate_s for p in parts)
        out.elapsed_s = max(p.elapsed_s for p in parts)
        for k, v in override.items():
            setattr(out, k, v)
        return out


def summary_table(s: CollectSummary):
    """A rich Table of a summary: per backend, the candidates, cache hits, measured, valid and invalid."""
    from rich.markup import escape
    from rich.table import Table

    title = f"collage-ml collect ({s.sampler}{', shard ' + s.shard if s.shard else ''}): {s.stopped}"
    t = Table(title=escape(title))
    cols = (("backend", None), ("cands", "candidates"), ("subsmp", "subsampled"), ("cached", "cache_hits"),
            ("to do", "planned"), ("measured", "measured"), ("valid", "valid"), ("invalid", "invalid"))
    for head, _ in cols:
        if head == "backend":
            t.add_column(head, no_wrap=True, min_width=max([7, *map(len, s.by_backend)]))
        else:
            t.add_column(head, justify="right")
    keys = [k for _, k in cols[1:]]
    for b, c in s.by_backend.items():
        t.add_row(escape(b), *(str(c.get(k, 0)) for k in keys))  # onnxruntime[spin=on] is not markup
    tot = {k: sum(c.get(k, 0) for c in s.by_backend.values()) for k in keys}
    t.add_row("[bold]total[/]", *(f"[bold]{tot[k]}[/]" for k in keys))
    caption = (
        f"{s.measured} measured in {_fmt_time(s.measure_s)} ({s.rate_per_min:.1f}/min), {s.remaining} left"
    )
    if s.unplanned_sources:
        caption += f" and {s.unplanned_sources} source{'s' * (s.unplanned_sources != 1)} not planned yet"
    if s.calibrations:
        caption += f"; {s.calibrations} calibration{'s' * (s.calibrations != 1)} in {_fmt_time(s.calibrate_s)}"
    if s.inductor_fraction < 1 and any(_subsampled_backend(b) for b in s.by_backend):
        caption += f"; inductor subsampled to {s.inductor_fraction:g}"
    caption += f"\nhardware {s.hardware}\ndb {s.db}"
    if s.skipped:
        caption += "\nskipped: " + "; ".join(s.skipped)
    t.caption = caption
    return t


def _fmt_time(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def print_summary(s: CollectSummary) -> None:
    """The summary table on stderr, as collect prints it at the end of a run (local or Ray)."""
    from rich.console import Console

    Console(stderr=True).print(summary_table(s))
