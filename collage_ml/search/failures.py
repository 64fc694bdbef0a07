"""Why candidates failed, summarised per backend, and why a graph has no finer cover.

A backend that fails most of its candidates with one error (a file the
backend cannot read, a missing kernel) is *systematic*: it is reported once,
as one line naming the backend and the error, not candidate by candidate.
Error texts are grouped after :func:`normalise` replaces what differs from
candidate to candidate (subgraph reprs, tensor and node names, numbers).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Mapping, Sequence

from collage_ml.candidates import Candidate
from collage_ml.ir.graph import Graph

#: a backend is systematically failing when one normalised error covers more than this share of its candidates
SYSTEMATIC_SHARE = 0.5

_SUBGRAPH = re.compile(r"SubGraph\([^()]*(\[[^\]]*\])?[^()]*\)")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d+")


def normalise(text: str, names: Iterable[str] = ()) -> str:
    """``text`` with subgraph reprs, quoted strings, the graph's tensor/node names and numbers masked."""
    t = _SUBGRAPH.sub("<subgraph>", text or "")
    t = _QUOTED.sub("<name>", t)
    known = set(names)
    if known:
        t = " ".join("<name>" if w.strip(".,:;()[]") in known else w for w in t.split(" "))
    return _NUMBER.sub("N", t).strip()


class FailureLog:
    """Collects (candidate, measurement) results and summarises the invalid ones per backend."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._names = set(graph.tensors) | {n.name for n in graph.nodes}
        self.total: dict[str, set] = {}  # backend -> distinct keys measured
        self.errors: dict[str, dict] = {}  # backend -> key -> raw error text

    def add(self, pairs: Iterable[tuple[Candidate, object]]) -> None:
        for c, m in pairs:
            b = c.backend.name
            self.total.setdefault(b, set()).add(c.key)
            if not getattr(m, "valid", True):
                self.errors.setdefault(b, {})[c.key] = getattr(m, "error_text", "") or "invalid"

    def by_backend(self) -> dict[str, dict]:
        """backend -> {"measured", "invalid", "main_reason", "main_count"} (main reason: the commonest error)."""
        out = {}
        for b, keys in self.total.items():
            errs = self.errors.get(b, {})
            row = {"measured": len(keys), "invalid": len(errs), "main_reason": None, "main_count": 0}
            if errs:
                groups = Counter(normalise(t, self._names) for t in errs.values())
                norm, count = groups.most_common(1)[0]
                # show one real text of the commonest group (names and all), cut to one line
                example = next(t for t in errs.values() if normalise(t, self._names) == norm)
                row.update(main_reason=example.splitlines()[0][:300], main_count=count)
            out[b] = row
        return out

    def systematic(self) -> list[dict]:
        """Backends where one error covers more than :data:`SYSTEMATIC_SHARE` of their measured candidates."""
        return [
            {"backend": b, "count": r["main_count"], "of": r["measured"], "error": r["main_reason"]}
            for b, r in self.by_backend().items()
            if r["measured"] and r["main_count"] > SYSTEMATIC_SHARE * r["measured"]
        ]

    def summary_lines(self) -> list[str]:
        return [f"{s['backend']}: {s['count']} of {s['of']} candidates failed the same way: {s['error']}"
                for s in self.systematic()]


def uncovered_nodes(graph: Graph, cands: Sequence[Candidate], usable: Mapping) -> list[int]:
    """Nodes that no usable candidate contains (``usable``: candidate key -> cost, None = unusable)."""
    covered = 0
    for c in cands:
        if usable.get(c.key) is not None:
            covered |= c.subgraph.mask
    return [i for i in range(len(graph)) if not covered >> i & 1]


def no_cover_reason(graph: Graph, cands: Sequence[Candidate], usable: Mapping, failures: FailureLog | None = None,
                    backends: Sequence = ()) -> str:
    """One line: which node has no valid candidate, and what each backend said about it."""
    missing = uncovered_nodes(graph, cands, usable)
    if not missing:
        return "no combination of valid candidates covers the graph"
    n = graph.nodes[missing[0]]
    said = []
    for b in backends:
        own = [c for c in cands if c.backend is b and c.subgraph.mask >> n.index & 1]
        if not own:
            said.append(f"{b.name} declines it")
            continue
        errs = [failures.errors.get(b.name, {}).get(c.key) for c in own] if failures else []
        errs = [e for e in errs if e]
        said.append(f"{b.name}: {errs[0].splitlines()[0][:160]}" if errs else f"{b.name}: not measured")
    more = f" (and {len(missing) - 1} more node(s))" if len(missing) > 1 else ""
    return (f"no valid candidate covers node {n.name!r} ({n.op_type}){more}"
            + (f"; {'; '.join(said)}" if said else ""))
