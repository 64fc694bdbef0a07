"""Candidates: (SubGraph, Backend) pairs, enumerated from each backend's patterns.

A candidate is what is measured, featurized and predicted. Its ``key``
(subgraph hash, backend name, backend version) plus the hardware fingerprint
is the database key. Duplicates collapse by structural hash at measurement
time: an identical block repeated in a model is measured once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from collage_ml.backends.base import Backend
from collage_ml.cost import CandidateKey
from collage_ml.ir.graph import Graph, SubGraph


@dataclass(frozen=True, eq=False)
class Candidate:
    subgraph: SubGraph
    backend: Backend
    pattern: str = ""

    @property
    def key(self) -> CandidateKey:
        return CandidateKey(self.subgraph.hash, self.backend.name, self.backend.version)

    def __repr__(self) -> str:
        return f"Candidate({self.backend.name}, {self.subgraph!r})"


def enumerate_candidates(
    graph: Graph, backends: Iterable[Backend], max_region_size: int | None = None
) -> Iterator[Candidate]:
    """Every (subgraph, backend) that a backend's patterns match, each node set once per backend.

    ``max_region_size`` overrides the region patterns' size bound; the maximal
    supported regions (e.g. the whole model) are produced regardless.
    """
    from dataclasses import replace

    for b in backends:
        seen: set[int] = set()
        supported = {n.index for n in graph.nodes if b.supports(graph, n)}
        ok = supported.__contains__
        for p in b.patterns:
            if max_region_size is not None and p.kind == "region":
                p = replace(p, max_size=max_region_size)
            for mask in p.matches(graph, lambda n: ok(n.index)):
                if mask not in seen:
                    seen.add(mask)
                    yield Candidate(SubGraph(graph, mask), b, p.name)
