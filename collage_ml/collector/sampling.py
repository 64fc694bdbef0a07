"""Random subgraph sampling, for training data that covers more than the placement search sees.

:func:`sample_masks` draws random **convex, connected** node sets of a
:class:`~collage_ml.ir.graph.Graph`, of every size from 1 up to a bound: it
picks a size uniformly, a random start node, and grows the set one random
neighbour at a time, closing it under convexity after each step (the convex
hull of a connected set is connected, so every result is both). A step that
would overshoot the size is rejected and another neighbour is tried, so a set
may end smaller than its target where the graph leaves no room.

:func:`sample_subgraphs` keeps structurally distinct results only (by
:attr:`SubGraph.hash`), since identical blocks would be one database key.

Everything is seeded: the same ``(graph, count, max_size, seed, label)`` gives
the same samples in every process (``random.Random`` seeded with a string is
stable across runs, unlike Python's ``hash()``).

:func:`sample_sources` lists the (model, batch size) pairs the ``random``
sampler of ``collage-ml collect`` draws from: each zoo model at several batch
sizes, so the data covers the zoo's blocks at shapes the zoo itself does not
have at batch 1.
"""

from __future__ import annotations

import random
from typing import Callable, Iterable, Sequence

from collage_ml.ir.graph import Graph, SubGraph, iter_bits

#: batch sizes the random sampler uses when none are given
DEFAULT_RANDOM_BATCH_SIZES = (1, 2, 4, 8, 16)


def popcount(mask: int) -> int:
    return bin(mask).count("1")


def convex_hull(graph: Graph, mask: int) -> int:
    """The smallest convex node set containing ``mask``: ``mask`` plus every node on a path between two of its nodes.

    One pass suffices: a node on a path between two added nodes is itself
    below some node of ``mask`` and above another.
    """
    down = up = 0
    for i in iter_bits(mask):
        down |= graph.descendants[i]
        up |= graph.ancestors[i]
    return mask | (down & up)


def _neighbours(graph: Graph, mask: int) -> int:
    nb = 0
    for i in iter_bits(mask):
        nb |= graph.pred_mask[i] | graph.succ_mask[i]
    return nb & ~mask


def random_convex_mask(graph: Graph, rng: random.Random, size: int, allowed: int | None = None) -> int | None:
    """One random convex connected node set of at most ``size`` nodes, inside ``allowed`` (a bitset; None: all).

    Returns None when ``allowed`` is empty.
    """
    allowed = graph.all_mask if allowed is None else allowed & graph.all_mask
    nodes = list(iter_bits(allowed))
    if not nodes or size < 1:
        return None
    mask = 1 << rng.choice(nodes)
    rejected = 0
    while popcount(mask) < size:
        options = [j for j in iter_bits(_neighbours(graph, mask) & allowed & ~rejected)]
        if not options:
            break
        j = rng.choice(options)
        grown = convex_hull(graph, mask | (1 << j))
        if popcount(grown) <= size and grown & ~allowed == 0:
            mask = grown
        else:
            rejected |= 1 << j
    return mask


def sample_masks(
    graph: Graph,
    count: int,
    max_size: int,
    seed: int = 0,
    *,
    label: str = "",
    allowed: int | None = None,
    max_attempts: int | None = None,
) -> list[int]:
    """Up to ``count`` distinct random convex connected node sets with 1..``max_size`` nodes.

    ``label`` (e.g. ``"resnet50@b2"``) is mixed into the seed so that different
    graphs get independent streams. Stops after ``max_attempts`` draws
    (default ``20 * count``), so a small graph may give fewer than ``count``.
    """
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    rng = random.Random(f"collage-ml-sample|{seed}|{label}|{graph.name}|{len(graph)}")
    attempts = max_attempts if max_attempts is not None else 20 * max(count, 1)
    out: list[int] = []
    seen: set[int] = set()
    for _ in range(attempts):
        if len(out) >= count:
            break
        m = random_convex_mask(graph, rng, rng.randint(1, max_size), allowed)
        if m is None:
            break
        if m not in seen:
            seen.add(m)
            out.append(m)
    return out


def sample_subgraphs(
    graph: Graph,
    count: int,
    max_size: int,
    seed: int = 0,
    *,
    label: str = "",
    allowed: int | None = None,
    keep: Callable[[SubGraph], bool] | None = None,
) -> list[SubGraph]:
    """Up to ``count`` structurally distinct random convex connected subgraphs (see :func:`sample_masks`).

    ``keep(sg)`` may reject samples (e.g. ones no backend can run); rejected
    ones do not count towards ``count``.
    """
    masks = sample_masks(
        graph, 20 * max(count, 1), max_size, seed, label=label, allowed=allowed, max_attempts=20 * max(count, 1)
    )
    out: list[SubGraph] = []
    hashes: set[str] = set()
    for m in masks:
        if len(out) >= count:
            break
        sg = SubGraph(graph, m)
        if sg.hash in hashes or (keep is not None and not keep(sg)):
            continue
        hashes.add(sg.hash)
        out.append(sg)
    return out


def sample_sources(
    models: Sequence[str], batch_sizes: Iterable[int] = DEFAULT_RANDOM_BATCH_SIZES, is_zoo: Callable[[str], bool] | None = None
) -> list[tuple[str, int]]:
    """The (model, batch) pairs to sample from: every zoo model at every batch size, in a fixed order.

    Models that are not zoo names (ONNX files) have fixed shapes and appear at batch 1 only.

    The order is interleaved, in rounds: each round visits every model once, the i-th model at the
    ``(i + round)``-th batch size (cyclically), and the rounds together hold every pair once. ``collect``
    plans and measures the sources in this order, so a budget that ends the run early has sampled every
    model, at a spread of batch sizes, rather than the first models at every batch size.
    """
    if is_zoo is None:
        from collage_ml.ir import zoo

        def is_zoo(name: str) -> bool:
            try:
                zoo.get(name)
                return True
            except Exception:
                return False

    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
    per_model = [(m, sizes if is_zoo(m) else [1]) for m in models]
    out = []
    for r in range(len(sizes)):
        for i, (m, bs) in enumerate(per_model):
            if r < len(bs):
                out.append((m, bs[(i + r) % len(bs)]))
    return out
