"""The plan of a collection: for each source, the candidates to measure as node bitsets; nothing is run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from collage_ml.collector.samplers import (
    DEFAULT_SAMPLES_PER_GRAPH, _check_sampler, _focus_select, _load_cost_model, _random_candidates, focus_weights,
)
from collage_ml.collector.sharding import (
    DEFAULT_INDUCTOR_FRACTION, _key_tuple, _subsampled_backend, in_shard, parse_shard, subsample_keep,
)
from collage_ml.collector.sources import (
    _activation_bytes, _import, _is_zoo, model_family, parse_batch_sizes, resolve_models,
)
from collage_ml.defaults import MAX_REGION_SIZE

#: sources whose activations (all intermediate tensors) exceed this are skipped, not run out of memory
DEFAULT_MAX_REFERENCE_BYTES = 4 * 2**30


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
    #: the imported graph, when planned lazily for measuring at once (:func:`plan_lazily`)
    graph: Any = field(default=None, repr=False)

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
    #: sources (model, batch) to plan, and how many have been planned so far
    sources: int = 0
    sources_planned: int = 0

    def keys(self) -> set[tuple[str, str, str]]:
        """The keys to measure (shard, subsample and cache hits applied); a full plan's (:func:`plan`)."""
        return {it[3] for w in self.works for it in w.items}

    @property
    def planned(self) -> int:
        """Candidates to measure in the sources planned so far."""
        return sum(c["planned"] for c in self.counts.values())


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
    p, works = plan_lazily(
        models, backends, sampler=sampler, shard=shard, seed=seed, threads=threads,
        max_region_size=max_region_size, batch_sizes=batch_sizes, inductor_fraction=inductor_fraction,
        samples_per_graph=samples_per_graph, known=known, cost_model=cost_model,
        max_reference_bytes=max_reference_bytes, on_source=on_source,
    )
    p.works = list(works)
    if sampler == "focus":
        p.works = _focus_select(p.works, seed, max_candidates)
        for c in p.counts.values():
            c["planned"] = 0
        for w in p.works:
            for it in w.items:
                p.counts[p.backends[it[1]].name]["planned"] += 1
    return p


def plan_lazily(
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
    max_reference_bytes: int = DEFAULT_MAX_REFERENCE_BYTES,
    on_source: Callable[[str], None] | None = None,
    keep_graphs: bool = False,
) -> tuple[CollectPlan, Iterator[_Work]]:
    """The plan's header (its works empty) and an iterator that plans one source per step.

    Each step adds that source's counts (and any skip) to the header before yielding its work, so
    :func:`collect` can measure a source as soon as it is planned: a budget then covers planning
    too, and a long random collection starts measuring at once. ``keep_graphs`` hands each work's
    imported graph along (``_Work.graph``), so the measuring step need not import it again. The
    focus sampler needs every source's weights before it draws, so it plans with :func:`plan`.
    Usage errors (samplers, shards, models, backends, batch sizes) are raised here, before any step.
    """
    from collage_ml.backends.base import resolve_backends
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
    hw = fingerprint(threads or default_threads())
    sources = sample_sources(model_list, sizes, is_zoo=_is_zoo)
    counts = {b.name: {"candidates": 0, "cache_hits": 0, "subsampled": 0, "planned": 0} for b in bks}
    header = CollectPlan(hw, bks, [], counts, model_list, list(sizes), sources=len(sources))
    works = _plan_sources(
        header, sources, sampler, shard_t, seed, max_region_size, inductor_fraction, samples_per_graph,
        known or set(), model_obj, max_reference_bytes, on_source, keep_graphs,
    )
    return header, works


def _plan_sources(
    p: CollectPlan, sources, sampler, shard_t, seed, max_region_size, inductor_fraction, samples_per_graph,
    known, model_obj, max_reference_bytes, on_source, keep_graphs,
) -> Iterator[_Work]:
    from collage_ml.candidates import enumerate_candidates

    bks, counts = p.backends, p.counts
    index = {id(b): i for i, b in enumerate(bks)}
    seen: set[tuple[str, str, str]] = set()
    for model, batch in sources:
        p.sources_planned += 1
        family = model_family(model) if sampler == "enumerate" else "random"
        work = _Work(model, batch, family)
        if on_source:
            on_source(work.label)
        graph = _import(model, batch)
        work.activation_bytes = _activation_bytes(graph)
        if work.activation_bytes > max_reference_bytes:
            p.skipped.append(
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
            cnt["planned"] += 1
            work.items.append((c.subgraph.mask, index[id(c.backend)], c.pattern, key))
        if model_obj is not None and pending:
            work.weights = focus_weights(pending, model_obj)
        if work.items:
            if keep_graphs:
                work.graph = graph
            yield work
        del graph, pending
