"""Collage's backend pattern language.

* :class:`OpPattern` is a fixed op sequence with constraints, such as
  ``Conv -> Add? -> Relu?`` for a library kernel. Each step after the first
  consumes the previous step's output, and that intermediate must have no
  other consumer (a fused kernel does not write it out).
* :class:`RegionPattern` generates convex connected regions of supported
  nodes up to a size bound, for compilers that fuse (ORT, OpenVINO, Inductor,
  TVM, TensorRT). The whole supported model is always one of its regions when
  every node is supported, whatever the bound.

Both yield node sets as ``int`` bitsets over the graph's node indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from collage_ml.ir.graph import Graph, Node, iter_bits

NodePredicate = Callable[[Graph, Node], bool]


def _always(graph: Graph, node: Node) -> bool:
    return True


@dataclass(frozen=True)
class Step:
    ops: frozenset[str]
    optional: bool = False
    constraint: NodePredicate = _always

    def matches(self, graph: Graph, node: Node) -> bool:
        return node.op_type in self.ops and self.constraint(graph, node)


def step(ops: str, optional: bool = False, constraint: NodePredicate = _always) -> Step:
    """``step("Conv|ConvTranspose")``: one step matching any of the ``|``-separated op types."""
    return Step(frozenset(ops.split("|")), optional, constraint)


class Pattern:
    """Base of the two pattern kinds; ``kind`` is "op" or "region"."""

    kind: str
    name: str

    def matches(self, graph: Graph, supported: Callable[[Node], bool]) -> Iterator[int]:
        raise NotImplementedError


@dataclass(frozen=True)
class OpPattern(Pattern):
    """A fixed op sequence; ``steps[0]`` must not be optional."""

    name: str
    steps: tuple[Step, ...]
    kind: str = field(default="op", init=False)

    def __post_init__(self):
        if not self.steps or self.steps[0].optional:
            raise ValueError(f"pattern {self.name!r}: the first step must be present and required")

    def matches(self, graph: Graph, supported: Callable[[Node], bool]) -> Iterator[int]:
        seen: set[int] = set()
        for node in graph.nodes:
            if not (self.steps[0].matches(graph, node) and supported(node)):
                continue
            for mask in self._extend(graph, supported, node, 1 << node.index, 1):
                if mask not in seen:
                    seen.add(mask)
                    yield mask

    def _extend(self, graph, supported, last: Node, mask: int, k: int) -> Iterator[int]:
        if k == len(self.steps):
            yield mask
            return
        st = self.steps[k]
        if st.optional:
            yield from self._extend(graph, supported, last, mask, k + 1)
        nxt = _sole_consumer(graph, last)
        if nxt is not None and st.matches(graph, nxt) and supported(nxt):
            yield from self._extend(graph, supported, nxt, mask | 1 << nxt.index, k + 1)
        elif not st.optional:
            return


def _sole_consumer(graph: Graph, node: Node) -> Node | None:
    """The only consumer of ``node``'s only output, if the output is not a graph output."""
    outs = [t for t in node.outputs if t]
    if len(outs) != 1 or outs[0] in graph.output_names:
        return None
    cons = graph.consumers.get(outs[0], ())
    return graph.nodes[cons[0]] if len(cons) == 1 else None


@dataclass(frozen=True)
class RegionPattern(Pattern):
    """Convex connected regions of supported nodes, with at most ``max_size`` nodes.

    Enumeration grows regions from each anchor node over neighbours with a
    higher index (each connected set is produced once, from its lowest node),
    keeps the convex ones, and stops after ``max_regions`` per graph. The
    maximal supported regions (whole connected components of supported
    nodes, when convex) are always produced, whatever the bounds.
    """

    name: str
    max_size: int = 8
    max_regions: int = 20000
    kind: str = field(default="region", init=False)

    def matches(self, graph: Graph, supported: Callable[[Node], bool]) -> Iterator[int]:
        ok = 0
        for n in graph.nodes:
            if supported(n):
                ok |= 1 << n.index
        seen: set[int] = set()
        for comp in _components(graph, ok):
            if graph.is_convex(comp):
                seen.add(comp)
                yield comp
        count = 0
        for anchor in iter_bits(ok):
            for mask in _grow(graph, ok, anchor, self.max_size):
                if mask in seen or not graph.is_convex(mask):
                    continue
                seen.add(mask)
                yield mask
                count += 1
                if count >= self.max_regions:
                    return


def _neighbours(graph: Graph, i: int) -> int:
    return graph.pred_mask[i] | graph.succ_mask[i]


def _components(graph: Graph, ok: int) -> list[int]:
    comps = []
    left = ok
    while left:
        start = left & -left
        comp = frontier = start
        while frontier:
            nxt = 0
            for i in iter_bits(frontier):
                nxt |= _neighbours(graph, i)
            nxt &= ok & ~comp
            comp |= nxt
            frontier = nxt
        comps.append(comp)
        left &= ~comp
    return comps


def _grow(graph: Graph, ok: int, anchor: int, max_size: int) -> Iterator[int]:
    """Connected sets with ``anchor`` as their lowest node, each exactly once (the ESU algorithm)."""
    allowed = ok & ~((1 << (anchor + 1)) - 1)

    def rec(mask: int, closed_nb: int, ext: int, size: int) -> Iterator[int]:
        yield mask
        if size == max_size:
            return
        while ext:
            low = ext & -ext
            ext ^= low
            w = low.bit_length() - 1
            nb_w = _neighbours(graph, w)
            exclusive = nb_w & allowed & ~closed_nb
            yield from rec(mask | low, closed_nb | nb_w | low, ext | exclusive, size + 1)

    first = 1 << anchor
    nb = _neighbours(graph, anchor)
    yield from rec(first, nb | first, nb & allowed, 1)
