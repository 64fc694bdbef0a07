"""``collage-ml collect``: gather measurements for training cost models.

A collection has two steps:

1. **Plan.** For each source graph (a zoo model at a batch size, or an ONNX
   file), list candidates with the chosen sampler, drop duplicate keys (the
   first model that produces a key gives its family), keep this shard's part,
   subsample slow backends (inductor), and skip every key the database already
   holds for this hardware fingerprint, valid or invalid. Planning imports
   each graph but keeps only node bitsets, so memory stays small.
2. **Measure.** One :class:`~collage_ml.measure.runner.Runner` (one persistent
   worker process) serves the whole run. For each source, the graph is
   imported again, its reference activations are computed once, and its
   candidates are measured one backend per phase. The Runner commits every
   measurement as it arrives, so a ``kill -9`` loses at most the candidate in
   flight, and a restart plans again and skips what is stored.

Samplers:

- ``enumerate``: every candidate the placement search would see
  (:func:`~collage_ml.candidates.enumerate_candidates` with ``max_region_size``).
- ``random``: random convex connected subgraphs (:mod:`collage_ml.collector.sampling`)
  of 1..``max_region_size`` nodes from the models at several batch sizes
  (default 1, 2, 4, 8, 16), each measured on every backend whose patterns can
  run it. Their family is ``"random"``; the pattern recorded in ``extra`` is
  ``random:<model>@b<batch>``.
- ``focus``: like ``random``, but drawn in proportion to a trained cost
  model's relative uncertainty (nn-Meter's builder loop); see
  :func:`focus_weights`.

Determinism: shards and the inductor subsample are pure functions of the
candidate key (SHA-256, never Python's ``hash()``), so ``--shard i/n`` on n
machines measures disjoint parts whose union is the unsharded work, and every
restart keeps the same subsample.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from collage_ml.db import default_db_path
from collage_ml.defaults import MAX_REGION_SIZE
from collage_ml.errors import CollageError, describe
from collage_ml.ui import Bar

SAMPLERS = ("enumerate", "random", "focus")
#: the share of inductor candidates measured (its compiles take 1-15 s each)
DEFAULT_INDUCTOR_FRACTION = 0.25
#: random subgraphs drawn per (model, batch size) by the random and focus samplers
DEFAULT_SAMPLES_PER_GRAPH = 100
#: sources whose activations (all intermediate tensors) exceed this are skipped, not run out of memory
DEFAULT_MAX_REFERENCE_BYTES = 4 * 2**30
#: of the focus sampler's pool, the share kept when max_candidates is not given
DEFAULT_FOCUS_SHARE = 0.25

FOCUS_NEEDS_MODEL = (
    "focus sampling needs a trained cost model (--cost-model); train one with `collage-ml train` first"
)
RAY_MISSING = "--ray needs Ray, which is not installed: pip install 'collage-ml[ray]'"

#: the clock budgets are measured with (tests replace it)
_clock = time.monotonic


# ----------------------------------------------------------------------------- argument checks


def parse_shard(shard: Any) -> tuple[int, int] | None:
    """``"i/n"`` or ``(i, n)`` with ``0 <= i < n`` -> ``(i, n)``; None -> None. ValueError otherwise."""
    if shard is None:
        return None
    text = shard if isinstance(shard, str) else "/".join(map(str, shard)) if isinstance(shard, (tuple, list)) else repr(shard)
    try:
        if isinstance(shard, str):
            a, sep, b = shard.strip().partition("/")
            if not sep:
                raise ValueError
            i, n = int(a), int(b)
        elif isinstance(shard, (tuple, list)) and len(shard) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in shard
        ):
            i, n = shard
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"bad shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(
            f"bad shard {text!r}: the index must be in 0..N-1 and N >= 1 (shards are numbered from 0: 0/2 and 1/2)"
        )
    return (i, n)


def parse_batch_sizes(batch_sizes: Any) -> tuple[int, ...] | None:
    if batch_sizes is None:
        return None
    items = batch_sizes.split(",") if isinstance(batch_sizes, str) else list(batch_sizes)
    try:
        out = tuple(sorted({int(str(b).strip()) for b in items if str(b).strip()}))
    except ValueError:
        raise ValueError(f"bad batch sizes {batch_sizes!r}: expected positive integers, e.g. 1,2,4") from None
    if not out or out[0] < 1:
        raise ValueError(f"bad batch sizes {batch_sizes!r}: expected positive integers, e.g. 1,2,4")
    return out


def _check_sampler(sampler: str) -> str:
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    return sampler


def resolve_models(models: str | Sequence[str] | None) -> list[str]:
    """Zoo names and ONNX paths, in order, without duplicates.

    ``"all"`` (or None) is every full-size zoo model; ``"tiny"`` every ``-tiny`` one.
    A comma-separated string is split. Unknown names raise ``UnknownModelError``.
    """
    from collage_ml.errors import ModelError
    from collage_ml.ir import zoo

    if models is None:
        models = "all"
    items = [m.strip() for m in models.split(",")] if isinstance(models, str) else [os.fspath(m) for m in models]
    out: list[str] = []
    for m in items:
        if not m:
            continue
        if m == "all":
            names = zoo.names(include_tiny=False)
        elif m in ("tiny", "all-tiny"):
            names = [n for n in zoo.names() if zoo.get(n).tiny]
        elif _is_path(m):
            if not Path(m).is_file():
                raise ModelError(f"{m}: no such ONNX file")
            names = [m]
        else:
            zoo.get(m)  # UnknownModelError with suggestions
            names = [m]
        out.extend(n for n in names if n not in out)
    if not out:
        raise ValueError("no models given")
    return out


def _is_path(m: str) -> bool:
    return m.endswith(".onnx") or os.path.sep in m or os.path.exists(m)


def _is_zoo(m: str) -> bool:
    return not _is_path(m)


def model_family(model: str) -> str:
    """The family recorded for a model: the zoo entry's family, or an ONNX file's stem."""
    if _is_zoo(model):
        from collage_ml.ir import zoo

        return zoo.get(model).family
    return Path(model).stem


# ----------------------------------------------------------------------------- stable hashing


def _key_tuple(key: Any) -> tuple[str, str, str]:
    if isinstance(key, tuple):
        return key  # type: ignore[return-value]
    return (key.subgraph_hash, key.backend, key.backend_version)


def _digest(key: Any, salt: str) -> int:
    h, b, v = _key_tuple(key)
    return int.from_bytes(hashlib.sha256(f"{salt}|{h}|{b}|{v}".encode()).digest()[:8], "big")


def shard_of(key: Any, n: int) -> int:
    """The shard (0..n-1) a candidate key belongs to: a SHA-256 of the key, stable across processes and machines."""
    return _digest(key, "collage-ml-shard") % n


def in_shard(key: Any, shard: tuple[int, int] | None) -> bool:
    return shard is None or shard_of(key, shard[1]) == shard[0]


def subsample_keep(key: Any, fraction: float) -> bool:
    """Whether a key is inside a deterministic ``fraction`` subsample (same answer on every run and machine)."""
    if fraction >= 1:
        return True
    if fraction <= 0:
        return False
    return _digest(key, "collage-ml-subsample") / 2**64 < fraction


def _subsampled_backend(name: str) -> bool:
    return name == "inductor" or name.startswith("inductor-")


# ----------------------------------------------------------------------------- focus hook


def focus_weights(candidates: Sequence[Any], cost_model: Any) -> list[float]:
    """The focus sampler's weights: one per candidate, highest where the cost model is least sure.

    Uses ``cost_model.predict(candidates) -> (mean, uncertainty)``; the
    uncertainty is the standard deviation of the predicted *log* latency
    (:mod:`collage_ml.models.base`), already relative, so it is the weight
    itself (nn-Meter's adaptive loop). A candidate the model cannot predict
    (NaN/inf) gets the largest weight.
    """
    import numpy as np

    cands = list(candidates)
    if not cands:
        return []
    mean, unc = cost_model.predict(cands)
    mean = np.asarray(mean, dtype=float).reshape(-1)
    unc = np.asarray(unc, dtype=float).reshape(-1)
    if len(mean) != len(cands) or len(unc) != len(cands):
        raise CollageError(
            f"the cost model predicted {len(mean)} means and {len(unc)} uncertainties for {len(cands)} candidates"
        )
    rel = np.abs(unc)
    finite = np.isfinite(rel)
    top = float(rel[finite].max()) if finite.any() else 1.0
    rel = np.where(finite, rel, max(top, 1e-6))
    return np.clip(rel, 1e-6, None).tolist()


def _load_cost_model(cost_model: Any) -> Any:
    """A cost-model object (anything with ``predict``), or a path loaded with ``collage_ml.models.load``."""
    if cost_model is None:
        raise CollageError(FOCUS_NEEDS_MODEL)
    if not isinstance(cost_model, (str, os.PathLike)):
        if not callable(getattr(cost_model, "predict", None)):
            raise CollageError(f"the cost model {type(cost_model).__name__} has no predict(candidates) method")
        return cost_model
    from collage_ml.models import load_model

    if str(cost_model) == "default":
        return load_model("default")
    path = Path(cost_model)
    if not path.exists():
        raise CollageError(f"{path}: no such cost model; train one with `collage-ml train` first")
    return load_model(path)


# ----------------------------------------------------------------------------- the plan


@dataclass
class _Work:
    """One source graph and the candidates to measure on it, as node bitsets."""

    model: str
    batch: int
    family: str
    #: (node bitset, backend index, pattern name, key tuple)
    items: list[tuple[int, int, str, tuple[str, str, str]]] = field(default_factory=list)
    weights: list[float] | None = None
    activation_bytes: int = 0

    @property
    def label(self) -> str:
        name = Path(self.model).name if not _is_zoo(self.model) else self.model
        return name if self.batch == 1 else f"{name}@b{self.batch}"


@dataclass
class CollectPlan:
    """What a collection will measure; built by :func:`plan`."""

    hardware: str
    backends: list[Any]
    works: list[_Work]
    #: per backend name: candidates in this shard (``candidates``), ``cache_hits`` (in the DB already),
    #: ``subsampled`` (left out by the inductor fraction) and ``planned`` (to measure)
    counts: dict[str, dict[str, int]]
    models: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    #: sources left out, with the reason (e.g. activations too large for memory)
    skipped: list[str] = field(default_factory=list)

    def keys(self) -> set[tuple[str, str, str]]:
        """The keys to measure (shard, subsample and cache hits applied)."""
        return {it[3] for w in self.works for it in w.items}

    @property
    def planned(self) -> int:
        return sum(len(w.items) for w in self.works)


def _import(model: str, batch: int):
    from collage_ml.ir.importers import import_model

    return import_model(model, batch=batch) if _is_zoo(model) else import_model(model)


def _activation_bytes(graph) -> int:
    return sum(t.nbytes for n, t in graph.tensors.items() if n not in graph.initializers)


def _random_candidates(graph, backends, count: int, max_size: int, seed: int, label: str):
    """Candidates on random convex subgraphs: each sampled subgraph on every backend whose patterns can run it."""
    from collage_ml.candidates import Candidate
    from collage_ml.collector.sampling import sample_subgraphs

    supported: list[int] = []
    op_masks: list[set[int]] = []
    region: list[bool] = []
    for b in backends:
        sup = 0
        for n in graph.nodes:
            if b.supports(graph, n):
                sup |= 1 << n.index
        supported.append(sup)
        region.append(any(p.kind == "region" for p in b.patterns))
        ops: set[int] = set()
        for p in b.patterns:
            if p.kind == "op":
                ops.update(p.matches(graph, lambda n, s=sup: bool(s >> n.index & 1)))
        op_masks.append(ops)

    def runnable(i: int, mask: int) -> bool:
        return (region[i] and mask & ~supported[i] == 0) or mask in op_masks[i]

    allowed = 0
    for s in supported:
        allowed |= s
    sgs = sample_subgraphs(
        graph, count, max_size, seed, label=label, allowed=allowed,
        keep=lambda sg: any(runnable(i, sg.mask) for i in range(len(backends))),
    )
    pattern = f"random:{label}"
    for sg in sgs:
        for i, b in enumerate(backends):
            if runnable(i, sg.mask):
                yield Candidate(sg, b, pattern)


def plan(
    models: str | Sequence[str] = "all",
    backends: Any = None,
    *,
    sampler: str = "enumerate",
    shard: Any = None,
    seed: int = 0,
    threads: int | None = None,
    max_region_size: int = MAX_REGION_SIZE,
    batch_sizes: Any = None,
    inductor_fraction: float = DEFAULT_INDUCTOR_FRACTION,
    samples_per_graph: int = DEFAULT_SAMPLES_PER_GRAPH,
    known: set[tuple[str, str, str]] | None = None,
    cost_model: Any = None,
    max_candidates: int | None = None,
    max_reference_bytes: int = DEFAULT_MAX_REFERENCE_BYTES,
    on_source: Callable[[str], None] | None = None,
) -> CollectPlan:
    """Lists what :func:`collect` would measure; nothing is run. ``known`` keys are cache hits.

    Arguments mean what they mean for :func:`collect`.
    """
    from collage_ml.backends.base import resolve_backends
    from collage_ml.candidates import enumerate_candidates
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.measure.runner import default_threads
    from collage_ml.collector.sampling import DEFAULT_RANDOM_BATCH_SIZES, sample_sources

    _check_sampler(sampler)
    shard_t = parse_shard(shard)
    if max_region_size < 1:
        raise ValueError(f"max_region_size must be >= 1, got {max_region_size}")
    if not 0 <= inductor_fraction <= 1:
        raise ValueError(f"inductor_fraction must be in [0, 1], got {inductor_fraction}")
    model_list = resolve_models(models)
    sizes = parse_batch_sizes(batch_sizes) or ((1,) if sampler == "enumerate" else DEFAULT_RANDOM_BATCH_SIZES)
    model_obj = _load_cost_model(cost_model) if sampler == "focus" else None
    bks = resolve_backends(backends)
    threads = threads or default_threads()
    hw = fingerprint(threads)
    known = known or set()

    counts = {b.name: {"candidates": 0, "cache_hits": 0, "subsampled": 0, "planned": 0} for b in bks}
    index = {id(b): i for i, b in enumerate(bks)}
    seen: set[tuple[str, str, str]] = set()
    works: list[_Work] = []
    skipped: list[str] = []
    for model, batch in sample_sources(model_list, sizes, is_zoo=_is_zoo):
        family = model_family(model) if sampler == "enumerate" else "random"
        work = _Work(model, batch, family)
        if on_source:
            on_source(work.label)
        graph = _import(model, batch)
        work.activation_bytes = _activation_bytes(graph)
        if work.activation_bytes > max_reference_bytes:
            skipped.append(
                f"{work.label}: its activations ({work.activation_bytes / 2**30:.1f} GiB) exceed "
                f"max_reference_bytes ({max_reference_bytes / 2**30:.1f} GiB)"
            )
            continue
        if sampler == "enumerate":
            cands = enumerate_candidates(graph, bks, max_region_size=max_region_size)
        else:
            cands = _random_candidates(graph, bks, samples_per_graph, max_region_size, seed, work.label)
        pending = []
        for c in cands:
            key = _key_tuple(c.key)
            if key in seen:
                continue
            seen.add(key)
            if not in_shard(key, shard_t):
                continue
            cnt = counts[c.backend.name]
            cnt["candidates"] += 1
            if _subsampled_backend(c.backend.name) and not subsample_keep(key, inductor_fraction):
                cnt["subsampled"] += 1
                continue
            if key in known:
                cnt["cache_hits"] += 1
                continue
            pending.append(c)
            work.items.append((c.subgraph.mask, index[id(c.backend)], c.pattern, key))
        if model_obj is not None and pending:
            work.weights = focus_weights(pending, model_obj)
        if work.items:
            works.append(work)
        del graph

    if model_obj is not None:
        works = _focus_select(works, seed, max_candidates)
    for w in works:
        for it in w.items:
            counts[bks[it[1]].name]["planned"] += 1
    return CollectPlan(hw, bks, works, counts, model_list, list(sizes), skipped)


def _focus_select(works: list[_Work], seed: int, max_candidates: int | None) -> list[_Work]:
    """Weighted sampling without replacement (Efraimidis-Spirakis keys ``u ** (1 / w)``), seeded."""
    import random

    rng = random.Random(f"collage-ml-focus|{seed}")
    scored = []
    for wi, w in enumerate(works):
        for ii, (item, weight) in enumerate(zip(w.items, w.weights or [1.0] * len(w.items))):
            scored.append((rng.random() ** (1.0 / max(weight, 1e-12)), wi, ii))
    total = len(scored)
    n = max_candidates if max_candidates is not None else math.ceil(DEFAULT_FOCUS_SHARE * total)
    chosen = sorted(scored, reverse=True)[:n]
    keep: dict[int, set[int]] = {}
    for _, wi, ii in chosen:
        keep.setdefault(wi, set()).add(ii)
    out = []
    for wi, w in enumerate(works):
        if wi in keep:
            w.items = [it for ii, it in enumerate(w.items) if ii in keep[wi]]
            w.weights = None
            out.append(w)
    return out


# ----------------------------------------------------------------------------- the summary


def _new_backend_counts() -> dict[str, int]:
    return {"candidates": 0, "planned": 0, "measured": 0, "valid": 0, "invalid": 0, "cache_hits": 0, "subsampled": 0}


@dataclass
class CollectSummary:
    """What a collection did. ``cache_hits`` counts candidates skipped because the database held them already.

    ``by_backend[name]`` has ``candidates`` (in this shard), ``subsampled`` (left out by
    ``inductor_fraction``), ``cache_hits``, ``planned`` (to measure), ``measured``, ``valid`` and
    ``invalid``; ``by_family[family]`` has ``measured``, ``valid`` and ``invalid``. ``stopped`` is
    ``complete``, ``budget``, ``max_candidates``, ``interrupted`` or ``dry-run``. ``remaining`` is
    what was planned but not measured. ``rate_per_min`` is measurements per minute of the measuring
    phase; ``elapsed_s`` includes planning.
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
    by_backend: dict[str, dict[str, int]] = field(default_factory=dict)
    by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    model_updates: int = 0  # focus sampler: cost-model updates from this run's measurements
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
        return self.measured / self.measure_s * 60 if self.measure_s > 0 else 0.0

    @property
    def invalid_by_backend(self) -> dict[str, int]:
        return {b: c["invalid"] for b, c in self.by_backend.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rate_per_min"] = round(self.rate_per_min, 2)
        d["invalid_by_backend"] = self.invalid_by_backend
        d["elapsed_s"] = round(self.elapsed_s, 3)
        d["measure_s"] = round(self.measure_s, 3)
        return d

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
        for k in ("candidates", "planned", "measured", "cache_hits", "subsampled", "valid", "invalid", "remaining"):
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
        out.elapsed_s = max(p.elapsed_s for p in parts)
        for k, v in override.items():
            setattr(out, k, v)
        return out


def summary_table(s: CollectSummary):
    """A rich Table of a summary: per backend, the candidates, cache hits, measured, valid and invalid."""
    from rich.table import Table

    title = f"collage-ml collect ({s.sampler}{', shard ' + s.shard if s.shard else ''}): {s.stopped}"
    t = Table(title=title)
    cols = (("backend", None), ("cands", "candidates"), ("subsmp", "subsampled"), ("cached", "cache_hits"),
            ("to do", "planned"), ("measured", "measured"), ("valid", "valid"), ("invalid", "invalid"))
    for head, _ in cols:
        if head == "backend":
            t.add_column(head, no_wrap=True, min_width=max([7, *map(len, s.by_backend)]))
        else:
            t.add_column(head, justify="right")
    keys = [k for _, k in cols[1:]]
    for b, c in s.by_backend.items():
        t.add_row(b, *(str(c.get(k, 0)) for k in keys))
    tot = {k: sum(c.get(k, 0) for c in s.by_backend.values()) for k in keys}
    t.add_row("[bold]total[/]", *(f"[bold]{tot[k]}[/]" for k in keys))
    caption = (
        f"{s.measured} measured in {_fmt_time(s.measure_s)} ({s.rate_per_min:.1f}/min), {s.remaining} left"
    )
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


# ----------------------------------------------------------------------------- collect


def collect(
    models: str | Sequence[str] = "all",
    backends: Any = None,
    db: Any = None,
    budget_minutes: float | None = None,
    max_candidates: int | None = None,
    sampler: str = "enumerate",
    shard: Any = None,
    seed: int = 0,
    threads: int | None = None,
    max_region_size: int = MAX_REGION_SIZE,
    batch_sizes: Any = None,
    progress: bool = True,
    ray_address: str | None = None,
    *,
    cost_model: Any = None,
    inductor_fraction: float = DEFAULT_INDUCTOR_FRACTION,
    samples_per_graph: int = DEFAULT_SAMPLES_PER_GRAPH,
    timing: Any = None,
    timeout: float = 120.0,
    max_reference_bytes: int = DEFAULT_MAX_REFERENCE_BYTES,
    dry_run: bool = False,
    on_measurement: Callable[[Any], None] | None = None,
    ray_shards: int | None = None,
    ray_retries: int | None = None,
    _skip: Mapping[str, Iterable[tuple[str, str, str]]] | None = None,
) -> CollectSummary:
    """Measures candidates of ``models`` on ``backends`` into ``db``; resumable, shardable, budgeted.

    - ``models``: zoo names and ONNX paths (a list or ``"a,b"``); ``"all"`` is every full-size
      zoo model, ``"tiny"`` every ``-tiny`` one.
    - ``backends``: names (a list or ``"a,b"``); None is the default CPU set.
    - ``db``: a path or an open :class:`~collage_ml.db.Database`; None is :func:`default_db_path`.
    - ``budget_minutes``: stop after this many minutes (checked between candidates; a candidate in
      flight finishes, at most ``timeout`` seconds). ``max_candidates``: measure at most this many
      new candidates (cache hits do not count).
    - ``sampler``: ``enumerate``, ``random`` or ``focus`` (needs ``cost_model``: an object with
      ``predict(candidates) -> (mean, uncertainty)`` or a saved model's path).
    - ``shard``: ``"i/n"`` or ``(i, n)``: measure only keys whose stable hash falls in shard i.
    - ``batch_sizes``: batch sizes of zoo models; default ``(1,)`` for enumerate and
      ``(1, 2, 4, 8, 16)`` for random and focus.
    - ``inductor_fraction``: the deterministic share of inductor candidates measured.
    - ``samples_per_graph``: random subgraphs per (model, batch) for random and focus.
    - ``timing``: a :class:`~collage_ml.measure.timing.TimingConfig`; ``timeout`` bounds one
      candidate (seconds).
    - ``max_reference_bytes``: sources whose activations exceed this are skipped (listed in
      ``summary.skipped``).
    - ``dry_run``: plan only; the summary's ``planned`` says what would be measured.
    - ``ray_address``: run ``ray_shards`` (default: one per alive node with a CPU) shards as Ray
      tasks at this address (``"local"`` starts a local instance on loopback) and merge their
      databases into ``db``; Ray reruns a shard whose worker died up to ``ray_retries`` times
      (default :data:`RAY_TASK_RETRIES`), resuming its database.
    - ``on_measurement(measurement)`` is called after each new measurement.

    Ctrl-C stops cleanly: the summary says ``stopped="interrupted"``.
    """
    t_start = _clock()
    _check_sampler(sampler)
    if sampler == "focus" and cost_model is None:
        raise CollageError(FOCUS_NEEDS_MODEL)
    shard_t = parse_shard(shard)
    if budget_minutes is not None and not budget_minutes >= 0:
        raise ValueError(f"budget_minutes must be >= 0, got {budget_minutes}")
    if max_candidates is not None and (isinstance(max_candidates, bool) or int(max_candidates) != max_candidates or max_candidates < 0):
        raise ValueError(f"max_candidates must be an integer >= 0, got {max_candidates}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if ray_address is not None:
        if shard_t is not None:
            raise ValueError("--shard and --ray cannot be combined: with --ray, each node collects one shard")
        return _collect_ray(
            ray_address, db=db, progress=progress, ray_shards=ray_shards,
            max_retries=RAY_TASK_RETRIES if ray_retries is None else ray_retries,
            kwargs=dict(
                models=models, backends=backends, budget_minutes=budget_minutes, max_candidates=max_candidates,
                sampler=sampler, seed=seed, threads=threads, max_region_size=max_region_size,
                batch_sizes=batch_sizes, cost_model=cost_model, inductor_fraction=inductor_fraction,
                samples_per_graph=samples_per_graph, timing=timing, timeout=timeout,
                max_reference_bytes=max_reference_bytes, dry_run=dry_run,
            ),
        )

    from collage_ml.backends.base import resolve_backends
    from collage_ml.db import Database
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.measure.runner import default_threads

    # usage errors before the database is touched
    resolve_models(models)
    resolve_backends(backends)
    parse_batch_sizes(batch_sizes)
    threads = threads or default_threads()
    hw = fingerprint(threads)
    own_db = not isinstance(db, Database)
    db_path = Path(os.fspath(db)) if own_db and db is not None else default_db_path() if own_db else db.path
    if own_db:
        if dry_run:
            database = Database(db_path, create=False, readonly=True) if db_path.exists() else None
        else:
            database = Database(db_path)
    else:
        database = db
    feedback = None
    if sampler == "focus":
        # the one feedback loop, shared with ``place``: new measurements update the model, saved next to the DB
        from collage_ml.featurize.hardware import HardwareDesc
        from collage_ml.models.base import CostModel
        from collage_ml.models.feedback import Feedback, updated_path

        from collage_ml.measure.probes import PROBE_SET_VERSION

        cost_model = _load_cost_model(cost_model)
        if isinstance(cost_model, CostModel):
            # this machine, with the probe results the database holds for it (`collage-ml calibrate` records them)
            here = HardwareDesc.current(threads).with_probes(
                database.probe_table(hw, PROBE_SET_VERSION) if database is not None else None)
            cost_model.hw = here  # the focus sampler's predictions are for this machine
            if not dry_run:
                feedback = Feedback(cost_model, updated_path(db_path, hw, cost_model.kind), here)
    try:
        known = database.known_keys(hw, getattr(timing, "name", None)) if database is not None else set()
        if _skip:
            known |= {tuple(k) for k in _skip.get(hw, ())}
        # the progress bar (stderr): ETA, candidates per minute and invalid count by backend
        with Bar(progress, stderr=True, rate=True) as prog:
            p = plan(
                models, backends, sampler=sampler, shard=shard_t, seed=seed, threads=threads,
                max_region_size=max_region_size, batch_sizes=batch_sizes, inductor_fraction=inductor_fraction,
                samples_per_graph=samples_per_graph, known=known, cost_model=cost_model,
                max_candidates=max_candidates, max_reference_bytes=max_reference_bytes, on_source=prog.planning,
            )
            prog.planned()
            summary = CollectSummary(
                db=str(db_path), hardware=hw, sampler=sampler, models=p.models,
                backends=[b.name for b in p.backends], batch_sizes=p.batch_sizes,
                shard=f"{shard_t[0]}/{shard_t[1]}" if shard_t else None, seed=seed, threads=threads,
                max_region_size=max_region_size, inductor_fraction=inductor_fraction, skipped=list(p.skipped),
            )
            for name, c in p.counts.items():
                b = summary.by_backend.setdefault(name, _new_backend_counts())
                for k in ("candidates", "cache_hits", "subsampled", "planned"):
                    b[k] = c[k]
            summary.candidates = sum(c["candidates"] for c in p.counts.values())
            summary.cache_hits = sum(c["cache_hits"] for c in p.counts.values())
            summary.subsampled = sum(c["subsampled"] for c in p.counts.values())
            summary.planned = p.planned
            if dry_run:
                summary.stopped = "dry-run"
                summary.remaining = p.planned
            else:
                total = p.planned if max_candidates is None else min(p.planned, int(max_candidates))
                prog.task("measuring", total)
                _measure(p, database, summary, prog, t_start, budget_minutes, max_candidates, threads, timing,
                         timeout, on_measurement, feedback)
        summary.elapsed_s = _clock() - t_start
        if progress:
            from rich.console import Console

            Console(stderr=True).print(summary_table(summary))
        return summary
    finally:
        if own_db and database is not None:
            database.close()


def _measure(
    p: CollectPlan, db, summary: CollectSummary, prog: Bar, t_start: float, budget_minutes, max_candidates,
    threads: int, timing, timeout: float, on_measurement, feedback=None,
) -> None:
    """Measures the plan's items through the tuner's measure step, which commits each measurement and
    hands it to ``feedback`` (the focus sampler's cost model; flushed once per source)."""
    from collage_ml.candidates import Candidate
    from collage_ml.cost import CandidateKey
    from collage_ml.ir.graph import SubGraph
    from collage_ml.measure.runner import Runner
    from collage_ml.measure.timing import TimingConfig
    from collage_ml.search.tuner import Tuner

    deadline = None if budget_minutes is None else t_start + budget_minutes * 60
    done = 0  # planned items dealt with: measured, or found in the DB meanwhile
    t_measure = _clock()

    def stop_reason() -> str | None:
        if max_candidates is not None and summary.measured >= max_candidates:
            return "max_candidates"
        if deadline is not None and _clock() >= deadline:
            return "budget"
        return None

    runner = Runner(db=db, threads=threads, timeout=timeout, timing=timing or TimingConfig())
    tuner = Tuner(runner, feedback=feedback)
    try:
        for work in p.works:
            if (why := stop_reason()) is not None:
                summary.stopped = why
                break
            prog.phase(f"{work.label}: reference")
            try:
                graph = _import(work.model, work.batch)
                reference = graph.reference()
            except Exception as e:  # an overnight run goes on with the next model
                summary.skipped.append(f"{work.label}: {describe(e, 10**6)}")
                continue
            groups: dict[int, list] = {}
            for it in work.items:
                groups.setdefault(it[1], []).append(it)
            for bi in sorted(groups):  # one backend per phase, in the order the backends were given
                backend = p.backends[bi]
                prog.phase(f"{work.label} · {backend.name}")
                items = groups[bi]
                pos = 0
                while pos < len(items):  # in chunks: the protocol's passes spread each candidate's processes
                    if (why := stop_reason()) is not None:
                        summary.stopped = why
                        break
                    room = runner.timing.pass_chunk
                    if max_candidates is not None:
                        room = max(1, min(room, max_candidates - summary.measured))
                    chunk = []
                    while pos < len(items) and len(chunk) < room:
                        mask, _, pattern, key = items[pos]
                        pos += 1
                        c = Candidate(SubGraph(graph, mask), backend, pattern)
                        if _key_tuple(c.key) != key:  # the re-imported graph must be the planned one
                            raise CollageError(
                                f"{work.label} changed between planning and measuring (a node set hashes "
                                "differently); run collect again"
                            )
                        if runner.lookup(CandidateKey(*key)) is not None:  # another process measured it meanwhile
                            summary.cache_hits += 1
                            summary.by_backend[backend.name]["cache_hits"] += 1
                            done += 1
                            prog.step()
                            continue
                        chunk.append(c)
                    new: dict = {}
                    ms = tuner.measure(chunk, reference, work.family, on_result=lambda c, m, n: new.update({c.key: n}))
                    for c, m in zip(chunk, ms):
                        done += 1
                        if not new[c.key]:  # another process committed it first
                            summary.cache_hits += 1
                            summary.by_backend[backend.name]["cache_hits"] += 1
                            prog.step()
                            continue
                        summary._record(backend.name, work.family, m.valid)
                        if on_measurement is not None:
                            on_measurement(m)
                        prog.step(backend.name, m.valid)
                if summary.stopped != "complete":
                    break
            if tuner.flush(work.family):
                summary.model_updates += 1
            del reference, graph
            if summary.stopped != "complete":
                break
    except KeyboardInterrupt:
        summary.stopped = "interrupted"
    finally:
        summary.measure_s = _clock() - t_measure
        summary.remaining = max(0, p.planned - done)
        runner.close()


# ----------------------------------------------------------------------------- Ray

#: how often Ray reruns a shard task whose worker process or node died; the rerun resumes the
#: shard's database, so it measures only what the dead attempt had not committed
RAY_TASK_RETRIES = 3
#: the environment a ``--ray local`` instance starts with when collage-ml imports Ray: no usage
#: reports, and every Ray address on loopback (Ray's single-machine mode, as on macOS)
RAY_LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _import_ray(address: str | None = None):
    import sys

    if address in ("local", "") and "ray" not in sys.modules:
        for k, v in RAY_LOCAL_ENV.items():  # read when Ray is imported
            os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError:
        raise CollageError(RAY_MISSING) from None
    return ray


def _ray_init(ray, address: str) -> None:
    """Connects to the cluster at ``address``, or starts a local instance (``"local"``) whose workers
    import this process's collage_ml (its source folder goes first on their PYTHONPATH)."""
    if address not in ("local", ""):
        ray.init(address=address, log_to_driver=False)
        return
    import collage_ml

    root = str(Path(collage_ml.__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    # address="local": a new instance, even when RAY_ADDRESS or a `ray start` on this machine names another
    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})


def ray_run_key(db_path: Any) -> str:
    """The name of the folder, under each node's ``<cache_dir()>/ray-shards/``, that holds the shard
    databases of a ``collect --ray`` into ``db_path``: a hash of this host and the database's absolute path.

    So a rerun into the same database (after a shard failed for good or the driver died) resumes from
    what the shards committed, and a collection into another database (another test session's) never
    sees them. A shard's files are removed once they are merged.
    """
    import socket

    where = f"{socket.gethostname()}|{Path(os.fspath(db_path)).resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


def ray_shard_dir(run_key: str) -> Path:
    """This node's folder for the shard databases of run ``run_key`` (see :func:`ray_run_key`)."""
    return default_db_path().parent / "ray-shards" / run_key


def _shard_snapshot(path: Path, attempts: int = 5, timeout: float = 30.0) -> tuple[bytes, int]:
    """The bytes of a shard database holding everything committed, and its number of measurements.

    The WAL is checkpointed into the main file, and the checkpoint is checked: nothing held it back
    (``busy == 0``), every WAL frame was copied back, and the ``-wal`` file is empty while a write
    lock keeps writers out until the bytes are read. CollageError when that cannot be had within
    ``attempts`` tries (each waits up to ``timeout`` seconds for other connections).
    """
    import sqlite3

    wal = path.with_name(path.name + "-wal")
    why = "no attempt"
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        for attempt in range(attempts):
            if attempt:
                time.sleep(0.2 * attempt)
            busy, log, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if busy or log != copied:
                why = f"the WAL checkpoint was held back (busy={busy}, {copied} of {log} frames copied)"
                continue
            conn.execute("BEGIN IMMEDIATE")  # no writer until the bytes are read
            try:
                if wal.exists() and wal.stat().st_size:
                    why = f"{wal.name} is not empty after the checkpoint"  # a write came in between
                    continue
                rows = conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                return path.read_bytes(), int(rows)
            finally:
                conn.execute("ROLLBACK")
    finally:
        conn.close()
    raise CollageError(f"{path}: no consistent copy of the shard database after {attempts} attempts: {why}")


def _ray_node_task(threads: int | None) -> dict:
    """A Ray task run once on each node before the shards: where it ran, its hardware fingerprint, collage_ml."""
    import ray

    import collage_ml
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.measure.runner import default_threads

    return {
        "node": ray.get_runtime_context().get_node_id(), "hardware": fingerprint(threads or default_threads()),
        "version": collage_ml.__version__, "collage_ml": collage_ml.__file__,
    }


def _ray_shard_task(i: int, n: int, run_key: str, kwargs: dict, known: dict) -> dict:
    """One Ray task: collect shard ``i/n`` into this node's shard database; return a copy of it.

    The database, ``ray_shard_dir(run_key)/shard-<i>-of-<n>.db``, commits each measurement as it
    arrives and outlives the task: Ray's retry after the worker died, or a rerun after the driver
    died, resumes it. The driver removes it once merged. A dry run writes nothing (``data`` is empty).
    Returns ``summary`` (a dict), ``node`` (the Ray node id), ``path``, ``data`` and ``rows``.
    """
    import ray

    path = ray_shard_dir(run_key) / f"shard-{i}-of-{n}.db"
    s = collect(**kwargs, shard=(i, n), db=path, progress=False, _skip=known)
    out = {"summary": s.to_dict(), "node": ray.get_runtime_context().get_node_id(), "path": str(path),
           "data": b"", "rows": 0}
    if not kwargs.get("dry_run") and path.exists():
        out["data"], out["rows"] = _shard_snapshot(path)
    return out


def _ray_cleanup_task(paths: list[str]) -> int:
    """Removes merged shard databases (with their -wal and -shm files) and their folder once empty."""
    removed = 0
    for p in map(Path, paths):
        for f in (p, p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm")):
            try:
                f.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        try:
            p.parent.rmdir()
        except OSError:  # another shard of this run is still there
            pass
    return removed


def _merge_shard(database, tmp: Path, data: bytes, rows: int) -> None:
    """Writes a shard's bytes to ``tmp``, checks that the copy holds the ``rows`` the shard counted, merges it."""
    from collage_ml.db import Database

    tmp.write_bytes(data)
    with Database(tmp, create=False, readonly=True) as part:  # validates the copy
        got = part.count()
    if got != rows:
        raise CollageError(f"the copy of a shard database holds {got} measurements, the shard counted {rows}")
    database.merge(tmp)


def _summary_from_dict(d: Mapping[str, Any]) -> CollectSummary:
    names = set(CollectSummary.__dataclass_fields__)
    return CollectSummary(**{k: v for k, v in d.items() if k in names})


def _collect_ray(
    ray_address: str, *, db: Any, progress: bool, ray_shards: int | None, kwargs: dict,
    max_retries: int = RAY_TASK_RETRIES,
) -> CollectSummary:
    """Runs ``ray_shards`` shards (default: one per alive node with a CPU) as Ray tasks, each into a
    database on its node, and merges each into ``db`` as it finishes.

    The nodes must share one hardware fingerprint (measurements are per hardware; a shard split over
    two kinds of machine would leave both kinds half measured): CollageError otherwise, before any
    measurement. A shard that still fails after ``max_retries`` reruns raises CollageError once the
    others are merged; its committed rows stay on its node and the same command resumes them.
    ``dry_run`` writes nothing, neither ``db`` nor a shard database.
    """
    from collage_ml import __version__
    from collage_ml.db import Database

    ray = _import_ray(ray_address)
    t0 = time.monotonic()
    dry_run = bool(kwargs.get("dry_run"))
    own_db = not isinstance(db, Database)
    path = Path(os.fspath(db)) if own_db and db is not None else default_db_path() if own_db else db.path
    database = db if not own_db else Database(path, create=False, readonly=True) if path.exists() else None
    started = False
    try:
        if not ray.is_initialized():
            _ray_init(ray, ray_address)
            started = True
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as OnNode

        nodes = [nd for nd in ray.nodes() if nd.get("Alive") and nd.get("Resources", {}).get("CPU", 0) >= 1]
        if not nodes:
            raise CollageError(f"the Ray cluster at {ray_address!r} has no alive node with a CPU")
        probe = ray.remote(num_cpus=1)(_ray_node_task)
        infos = ray.get([
            probe.options(scheduling_strategy=OnNode(node_id=nd["NodeID"], soft=False)).remote(kwargs.get("threads"))
            for nd in nodes
        ])
        hardware = sorted({x["hardware"] for x in infos})
        if len(hardware) > 1:
            raise CollageError(
                f"the Ray cluster's nodes have {len(hardware)} hardware fingerprints ({', '.join(hardware)}); "
                "measurements are per hardware, so run one cluster per kind of machine, each into its own "
                "database, and `collage-ml db merge` them"
            )
        if stale := sorted({f"{x['version']} ({x['collage_ml']})" for x in infos if x["version"] != __version__}):
            raise CollageError(f"the Ray nodes run collage-ml {', '.join(stale)}; this driver runs {__version__}")
        if own_db and not dry_run:  # created only once the cluster passed (an existing one was checked above)
            if database is not None:
                database.close()
            database = Database(path)
        n = ray_shards or len(nodes)
        run_key = ray_run_key(path)
        # the driver's DB is the resume point: the shards skip what it holds for this hardware
        known_ref = ray.put({hardware[0]: sorted(database.known_keys(hardware[0]))} if database is not None else {})
        task = ray.remote(num_cpus=1, max_retries=max_retries)(_ray_shard_task)
        cleanup = ray.remote(num_cpus=0)(_ray_cleanup_task)
        shard_of_ref = {
            task.options(scheduling_strategy=OnNode(node_id=nodes[i % len(nodes)]["NodeID"], soft=True)).remote(
                i, n, run_key, kwargs, known_ref
            ): i
            for i in range(n)
        }
        parts: list[CollectSummary] = []
        failed: list[str] = []
        cleanups = []
        pending = list(shard_of_ref)
        with tempfile.TemporaryDirectory(prefix="collage-ml-ray-merge-") as tmp:
            while pending:  # merge each shard as it finishes
                (ref,), pending = ray.wait(pending, num_returns=1)
                i = shard_of_ref[ref]
                try:
                    r = ray.get(ref)
                except Exception as e:  # the task raised, or its worker or node died max_retries + 1 times
                    failed.append(f"shard {i}/{n}: {describe(e, 300)}")
                    continue
                parts.append(_summary_from_dict(r["summary"]))
                if r["data"]:
                    _merge_shard(database, Path(tmp) / f"shard-{i}.db", r["data"], r["rows"])
                    cleanups.append(
                        cleanup.options(scheduling_strategy=OnNode(node_id=r["node"], soft=False)).remote([r["path"]])
                    )
        for ref in cleanups:  # best effort: a node that died since keeps its files
            try:
                ray.get(ref, timeout=60)
            except Exception:
                pass
        if failed:
            raise CollageError(
                f"{len(failed)} of {n} Ray shards failed ({'; '.join(failed)}); the others are merged into "
                f"{path}; a failed shard's measurements stay on its node in <cache>/ray-shards/{run_key}, "
                "and running the same command again resumes them"
            )
        summary = CollectSummary.combine(parts, db=str(path), shard=None)
        summary.elapsed_s = time.monotonic() - t0
        if progress:
            from rich.console import Console

            Console(stderr=True).print(summary_table(summary))
        return summary
    finally:
        if own_db and database is not None:
            database.close()
        if started:
            ray.shutdown()


# ----------------------------------------------------------------------------- CLI


def _arg(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ValueError with a clear message."""

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = fn.__name__
    return parse


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= 0, got {text!r}") from None
    if v < 0:
        raise ValueError(f"expected an integer >= 0, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0 or math.isinf(v):
        raise ValueError(f"expected a finite number >= 0, got {text!r}")
    return v


def _fraction(text: str) -> float:
    v = _nonneg_float(text)
    if v > 1:
        raise ValueError(f"expected a fraction in [0, 1], got {text!r}")
    return v


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Adds the ``collect`` subcommand to an argparse subparsers object; ``run(args)`` executes it."""
    p = subparsers.add_parser(
        "collect",
        help="measure candidates into a database (resumable, shardable, budgeted)",
        description=(
            "Measure candidates of models on backends into a measurement database, for training cost models. "
            "Safe to stop at any time (Ctrl-C or kill): a restart skips everything the database already holds "
            "for this hardware."
        ),
    )
    p.add_argument("--models", default="all", metavar="a,b|all",
                   help="zoo names and .onnx paths, comma-separated; 'all' = every full-size zoo model, "
                        "'tiny' = every -tiny one (default: all)")
    p.add_argument("--backends", default=None, metavar="a,b", help="backends, comma-separated (default: the CPU set)")
    p.add_argument("--db", default=None, metavar="PATH",
                   help="database (default: $COLLAGE_ML_CACHE/measurements.db or ~/.cache/collage-ml/measurements.db)")
    p.add_argument("--budget-minutes", type=_arg(_nonneg_float), default=None, metavar="N",
                   help="stop after N minutes (checked between candidates)")
    p.add_argument("--max-candidates", type=_arg(_nonneg_int), default=None, metavar="N",
                   help="measure at most N new candidates")
    p.add_argument("--sampler", choices=SAMPLERS, default="enumerate",
                   help="enumerate: what the placement search sees; random: random convex subgraphs at several "
                        "batch sizes; focus: where --cost-model is least sure (default: enumerate)")
    p.add_argument("--shard", type=_arg(parse_shard), default=None, metavar="I/N",
                   help="measure only shard I of N (0 <= I < N), split by a stable hash of the candidate key")
    p.add_argument("--seed", type=int, default=0, help="seed of the random and focus samplers (default: 0)")
    p.add_argument("--threads", type=_arg(_positive_int), default=None, metavar="N",
                   help="intra-op threads for every backend (default: $COLLAGE_ML_THREADS or the physical cores)")
    p.add_argument("--max-region-size", type=_arg(_positive_int), default=MAX_REGION_SIZE, metavar="N",
                   help=f"largest region (nodes) enumerated or sampled (default: {MAX_REGION_SIZE})")
    p.add_argument("--batch-sizes", type=_arg(parse_batch_sizes), default=None, metavar="1,2,...",
                   help="batch sizes of zoo models (default: 1 for enumerate, 1,2,4,8,16 for random and focus)")
    p.add_argument("--samples-per-graph", type=_arg(_positive_int), default=DEFAULT_SAMPLES_PER_GRAPH, metavar="N",
                   help=f"random subgraphs per model and batch size (default: {DEFAULT_SAMPLES_PER_GRAPH})")
    p.add_argument("--inductor-fraction", type=_arg(_fraction), default=DEFAULT_INDUCTOR_FRACTION, metavar="F",
                   help=f"share of inductor candidates measured; its compiles are slow (default: "
                        f"{DEFAULT_INDUCTOR_FRACTION})")
    p.add_argument("--timeout", type=_arg(_nonneg_float), default=120.0, metavar="S",
                   help="seconds allowed for one candidate's compile and timing (default: 120)")
    p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS",
                   help="run one shard per node of this Ray cluster ('local' starts one here) and merge the results")
    p.add_argument("--cost-model", default=None, metavar="PATH", help="trained cost model (needed by --sampler focus)")
    p.add_argument("--dry-run", action="store_true", help="plan only: count what would be measured")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or summary table")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    return p


def run(args: argparse.Namespace) -> int:
    """Runs ``collage-ml collect`` for parsed ``args``; 0 when done or stopped by a budget, 130 when interrupted."""
    summary = collect(
        models=args.models, backends=args.backends, db=args.db, budget_minutes=args.budget_minutes,
        max_candidates=args.max_candidates, sampler=args.sampler, shard=args.shard, seed=args.seed,
        threads=args.threads, max_region_size=args.max_region_size, batch_sizes=args.batch_sizes,
        progress=not args.no_progress, ray_address=args.ray_address, cost_model=args.cost_model,
        inductor_fraction=args.inductor_fraction, samples_per_graph=args.samples_per_graph,
        timeout=args.timeout, dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    elif args.no_progress:
        print(
            f"{summary.stopped}: {summary.measured} measured ({summary.valid} valid, {summary.invalid} invalid), "
            f"{summary.cache_hits} cache hits, {summary.remaining} left; db {summary.db}"
        )
    return 130 if summary.stopped == "interrupted" else 0


__all__ = [
    "SAMPLERS", "CollectPlan", "CollectSummary", "add_parser", "collect", "default_db_path", "focus_weights",
    "in_shard", "parse_shard", "plan", "resolve_models", "run", "shard_of", "subsample_keep", "summary_table",
]
