"""The groups of candidates a cost model is scored within: the ones the placement search compares.

The search never needs a latency for its own sake: it needs to *rank* the
candidates that compete for the same decision. :mod:`collage_ml.models.evaluate`
scores rankings within these groups (the metrics are in :mod:`collage_ml.models.metrics`):

- **Decision groups.** The op-level dynamic program covers a model node by
  node in topological order; at each step the candidates that compete are the
  ones whose topologically first node is the first uncovered node.
  :func:`decision_groups` rebuilds these groups by enumerating each zoo source
  family's full-size model at batch 1 (the way ``collage-ml collect --sampler
  enumerate`` does) and mapping every (subgraph hash, backend) to the first
  node of each place it occurs.

  Caveat: the candidates of one group cover *different* node sets (a 1-node
  op and a 3-node region starting at the same node), and the DP compares
  ``cost(candidate) + best(rest)``, not the candidate costs alone. These
  metrics compare the candidate latencies as the model predicts them, i.e. the
  term of the DP's sum that the cost model is responsible for; a perfect
  ranking here is necessary for a perfect DP decision, not sufficient.
- **Backend groups.** The same subgraph (hash) measured on two or more
  backends: which backend should run it. This is the cleanest comparison
  (same work, different backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from collage_ml.models.dataset import Dataset, Sample


@dataclass
class DecisionGroups:
    """Index arrays into one dataset's samples; see :func:`decision_groups`."""

    groups: list[np.ndarray] = field(default_factory=list)
    labels: list[tuple[str, str, int]] = field(default_factory=list)  # (hardware, family, first node)
    ungrouped: int = 0  # samples in no group
    unrebuilt: dict[str, int] = field(default_factory=dict)  # source that is no zoo family -> samples
    n: int = 0  # samples of the dataset the indices refer to

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self):
        return iter(self.groups)


# (model name, max_region_size, backends) -> first node -> [(hash, backend)]
_ENUM_CACHE: dict[tuple[str, int | None, tuple[str, ...]], dict[int, list[tuple[str, str]]]] = {}


def _zoo_families() -> set[str]:
    from collage_ml.ir import zoo

    return {e.family for e in zoo.entries(include_tiny=False)}


def _enumeration(model: str, max_region_size: int | None, backends: tuple[str, ...]) -> dict[int, list[tuple[str, str]]]:
    key = (model, max_region_size, backends)
    hit = _ENUM_CACHE.get(key)
    if hit is not None:
        return hit
    from collage_ml.backends import get_backend
    from collage_ml.candidates import enumerate_candidates
    from collage_ml.errors import CollageError
    from collage_ml.ir.importers import import_model

    bs = []
    for name in backends:
        try:
            bs.append(get_backend(name))  # patterns need no installed backend: no require()
        except CollageError:
            continue  # a backend this install does not know cannot be rebuilt
    graph = import_model(model, batch=1)
    by_node: dict[int, list[tuple[str, str]]] = {}
    seen: set[tuple[int, str]] = set()
    for c in enumerate_candidates(graph, bs, max_region_size):
        mask = c.subgraph.mask
        if (mask, c.backend.name) in seen:
            continue
        seen.add((mask, c.backend.name))
        first = (mask & -mask).bit_length() - 1  # lowest set bit: the topologically first node
        by_node.setdefault(first, []).append((c.subgraph.hash, c.backend.name))
    _ENUM_CACHE[key] = by_node
    return by_node


def decision_groups(
    dataset: Dataset | Sequence[Sample],
    max_region_size: int | None = 3,
    backends: Iterable[str] | None = None,
    models: Mapping[str, str] | None = None,
) -> DecisionGroups:
    """The decision groups of ``dataset`` (see the module docstring).

    Each zoo source family's full-size model is enumerated at batch 1 over
    ``backends`` (default: the backends present in the data) with region
    patterns bounded by ``max_region_size`` (3 is what the shipped datasets
    used). A group is (hardware, family, first node) -> the dataset's samples
    with those (hash, backend) keys, one sample per key; groups with fewer than
    two samples are dropped, and so are exact duplicates within a family (a
    block repeated in a model, like BERT's layers, is one decision, scored once).

    ``models`` maps a source family to the zoo model to rebuild it from
    (default: the family's full-size model; tests use ``-tiny`` ones).
    Sources that are no zoo family (and not in ``models``) are counted in
    ``unrebuilt``. Enumerations are cached in-process.

    Rows that recorded their decision (``Sample.decision``: the source graph's hash and the candidate's
    first node, stored by the Runner since protocol m2) are grouped by it directly, from any model, zoo or
    not, and are not rebuilt.
    """
    samples = list(dataset)
    names = tuple(sorted({s.backend for s in samples} if backends is None else set(backends)))
    models = dict(models or {})
    zoo_fams = _zoo_families()
    index: dict[tuple[str, str, str], int] = {}  # (hardware, hash, backend) -> first sample
    hardware: list[str] = []
    sources: dict[str, int] = {}
    out = DecisionGroups(n=len(samples))
    grouped = np.zeros(len(samples), dtype=bool)
    # rows that recorded their decision (source graph hash, first node) group by it, whatever model they came from
    recorded: dict[tuple, dict[tuple[str, str], int]] = {}
    for i, s in enumerate(samples):
        if s.decision is not None:
            recorded.setdefault((s.hardware, *s.decision), {}).setdefault((s.info.hash, s.backend), i)
    seen_rec: set[tuple[int, ...]] = set()
    for (hw, src_hash, node), members in sorted(recorded.items()):
        idx = sorted(members.values())
        if len(idx) < 2:
            continue
        # a block repeated in a model is one decision: same (hash, backend) sets are scored once
        sig = (hw, src_hash, tuple(sorted(members)))
        if sig in seen_rec:
            continue
        seen_rec.add(sig)
        arr = np.array(idx, dtype=np.int64)
        out.groups.append(arr)
        out.labels.append((hw, samples[idx[0]].source, node))
        grouped[arr] = True
    for i, s in enumerate(samples):
        if s.decision is not None:
            continue
        k = (s.hardware, s.info.hash, s.backend)
        if k not in index:
            index[k] = i
        if s.hardware not in hardware:
            hardware.append(s.hardware)
        sources[s.source] = sources.get(s.source, 0) + 1
    rebuild = []
    for src in sorted(sources):
        if src in models:
            rebuild.append((src, models[src]))
        elif src in zoo_fams:
            rebuild.append((src, src))
        else:
            out.unrebuilt[src] = sources[src]
    for family, model in rebuild:
        by_node = _enumeration(model, max_region_size, names)
        for hw in hardware:
            seen: set[tuple[int, ...]] = set()
            for node in sorted(by_node):
                idx = sorted({index[(hw, h, b)] for h, b in by_node[node] if (hw, h, b) in index})
                if len(idx) < 2 or tuple(idx) in seen:
                    continue
                seen.add(tuple(idx))
                arr = np.array(idx, dtype=np.int64)
                out.groups.append(arr)
                out.labels.append((hw, family, node))
                grouped[arr] = True
    out.ungrouped = int((~grouped).sum())
    return out


def backend_groups(dataset: Dataset | Sequence[Sample]) -> list[np.ndarray]:
    """Index arrays: one per (hardware, subgraph hash) measured on two or more backends (one sample each)."""
    by: dict[tuple[str, str], dict[str, int]] = {}
    for i, s in enumerate(dataset):
        by.setdefault((s.hardware, s.info.hash), {}).setdefault(s.backend, i)
    return [np.array(sorted(d.values()), dtype=np.int64) for d in by.values() if len(d) >= 2]
