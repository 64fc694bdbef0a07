"""Collage's op-level dynamic program over candidate subgraphs.

The state is the set of covered nodes. Each step extends a state with a
candidate that contains the first uncovered node in topological order, does
not overlap the covered set, and whose every external input is produced by a
covered node (so the chosen order is an execution order and the plan is
acyclic). A plan's cost is the sum of its candidates' costs plus, for every
tensor that crosses into a candidate from another partition, the boundary
cost of that hand-off (producer backend, consumer backend, bytes), plus
an optional per-candidate ``overhead``: what a partition pays inside a plan
beyond its latency measured alone (:mod:`collage_ml.measure.context`).

Because boundary costs depend on which backend produced each live tensor,
the exact state is (covered set, backends of the covered nodes that still
have uncovered consumers). Dijkstra over these states is exact for a given
cost table. When the number of states passes ``max_states``, the search
restarts with the covered set alone as the state (Collage's original DP,
where the boundary costs of a state are those of the best path that reached
it) and reports ``limit_hit``.

The search space has one documented gap, inherited from Collage: a
candidate containing the first uncovered node must be ready at that point,
so a plan in which that node's partition waits for a partition that contains
only later nodes is not reachable. The graph-level search and the
whole-model plans cover what this misses.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from collage_ml.candidates import Candidate
from collage_ml.errors import CollageError
from collage_ml.ir.graph import Graph, iter_bits

BoundaryFn = Callable[[str, str, int], float]
OverheadFn = Callable[[Candidate], float]


def no_boundary(first: str, second: str, nbytes: int) -> float:
    return 0.0


@dataclass
class DPResult:
    choice: list[Candidate]  # in execution order
    cost: float
    states: int
    limit_hit: bool
    boundary_cost: float = 0.0
    per_candidate: list[float] = field(default_factory=list)  # the costs given, without overhead
    overhead_cost: float = 0.0  # the chosen candidates' overhead, included in ``cost``


class NoCoverError(CollageError):
    """No combination of the valid candidates covers the graph (a user-facing error: one line in the CLI)."""


@dataclass(frozen=True)
class _Prepared:
    mask: int
    ext_pred: int  # nodes outside the candidate that produce its inputs
    inputs: tuple[tuple[int, int], ...]  # (producer node, nbytes) per external input tensor
    backend: str
    cost: float


def _prepare(graph: Graph, cands: Sequence[Candidate], costs: Sequence[float | None],
             overhead: OverheadFn | None = None) -> list[_Prepared | None]:
    out: list[_Prepared | None] = []
    extra: dict = {}
    for c, cost in zip(cands, costs):
        if cost is None:
            out.append(None)
            continue
        if overhead is not None:
            k = (c.backend.name, c.subgraph.mask)
            if k not in extra:
                extra[k] = float(overhead(c))
            cost = float(cost) + extra[k]
        sg = c.subgraph
        ext = 0
        for i in sg.node_indices:
            ext |= graph.pred_mask[i]
        ext &= ~sg.mask
        ins = tuple(
            (graph.producer[t], graph.tensors[t].nbytes) for t in sg.inputs if t in graph.producer
        )
        out.append(_Prepared(sg.mask, ext, ins, c.backend.name, float(cost)))
    return out


def solve(
    graph: Graph,
    candidates: Sequence[Candidate],
    costs: Sequence[float | None],
    boundary: BoundaryFn = no_boundary,
    max_states: int = 200_000,
    overhead: OverheadFn | None = None,
) -> DPResult:
    """The cheapest cover of ``graph`` by ``candidates`` (``costs[i]`` in seconds, None = unusable), each
    candidate charged ``overhead(candidate)`` on top of its cost."""
    prep = _prepare(graph, candidates, costs, overhead)
    by_first: dict[int, list[int]] = {}
    for idx, p in enumerate(prep):
        if p is not None:
            for n in iter_bits(p.mask):
                by_first.setdefault(n, []).append(idx)
    found = _dijkstra(graph, prep, by_first, boundary, exact=True, max_states=max_states)
    limit_hit = found is None
    if found is None:
        found = _dijkstra(graph, prep, by_first, boundary, exact=False, max_states=None)
        assert found is not None
    choice, cost, states, bsum = found
    given = [float(costs[i]) for i in choice]
    return DPResult(
        [candidates[i] for i in choice], cost, states, limit_hit, bsum, given,
        sum(prep[i].cost for i in choice) - sum(given),
    )


def _dijkstra(graph, prep, by_first, boundary: BoundaryFn, exact: bool, max_states: int | None):
    """(chosen candidate indices, cost, states, boundary sum), or None past ``max_states``."""
    full = graph.all_mask
    succ = graph.succ_mask
    best: dict = {(0, ()) if exact else 0: 0.0}
    parent: dict = {}
    tie = itertools.count()
    heap = [(0.0, next(tie), 0, (), 0.0)]
    done = set()
    bcache: dict[tuple[str, str, int], float] = {}

    def bcost(a: str, b: str, n: int) -> float:
        k = (a, b, n)
        v = bcache.get(k)
        if v is None:
            v = bcache[k] = float(boundary(a, b, n))
        return v

    while heap:
        cost, _, covered, frontier, bsum = heapq.heappop(heap)
        key = (covered, frontier) if exact else covered
        if key in done:
            continue
        done.add(key)
        if covered == full:
            choice = []
            k = key
            while k in parent:
                k, idx = parent[k]
                choice.append(idx)
            choice.reverse()
            return choice, cost, len(best), bsum
        u = (~covered & full & -(~covered & full)).bit_length() - 1
        fmap = dict(frontier)
        for idx in by_first.get(u, ()):
            p = prep[idx]
            if p.mask & covered or p.ext_pred & ~covered:
                continue
            step_b = 0.0
            for producer, nbytes in p.inputs:
                step_b += bcost(fmap[producer], p.backend, nbytes)
            new_cov = covered | p.mask
            nf = []
            for n, b in frontier:
                if succ[n] & ~new_cov:
                    nf.append((n, b))
            for n in iter_bits(p.mask):
                if succ[n] & ~new_cov:
                    nf.append((n, p.backend))
            nf.sort()
            nfront = tuple(nf)
            ncost = cost + p.cost + step_b
            nkey = (new_cov, nfront) if exact else new_cov
            if nkey in done:
                continue
            old = best.get(nkey)
            if old is None or ncost < old - 1e-15:
                best[nkey] = ncost
                parent[nkey] = (key, idx)
                heapq.heappush(heap, (ncost, next(tie), new_cov, nfront, bsum + step_b))
                if max_states is not None and len(best) > max_states:
                    return None
    raise NoCoverError(
        "no combination of valid candidates covers the graph (every backend failed on some node?)"
    )
