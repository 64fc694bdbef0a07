"""The op-level DP against brute force, on small graphs with fake cost tables."""

import itertools
import random

import pytest
from onnx import TensorProto, helper

from collage_ml.candidates import Candidate
from collage_ml.ir import from_onnx
from collage_ml.ir.graph import iter_bits
from collage_ml.search.dp import NoCoverError, solve
from tests.fake_backends import FakeCostBackend
from tests.helpers import chain_model

A, B = FakeCostBackend("fake-a"), FakeCostBackend("fake-b")


def random_dag(n: int, seed: int):
    """n binary/unary elementwise nodes over [1, 4] tensors, random wiring, one input."""
    r = random.Random(seed)
    nodes, avail = [], ["x"]
    for i in range(n):
        if len(avail) > 1 and r.random() < 0.5:
            a, b = r.sample(avail, 2)
            nodes.append(helper.make_node("Add", [a, b], [f"t{i}"]))
        else:
            nodes.append(helper.make_node(r.choice(["Relu", "Sigmoid", "Tanh"]), [r.choice(avail)], [f"t{i}"]))
        avail.append(f"t{i}")
    used = {t for nd in nodes for t in nd.input}
    outs = [t for t in avail[1:] if t not in used]
    g = helper.make_graph(
        nodes, "dag", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4]) for t in outs],
    )
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def all_candidates(graph, max_size=3):
    cands = []
    n = len(graph)
    for size in range(1, max_size + 1):
        for combo in itertools.combinations(range(n), size):
            m = sum(1 << i for i in combo)
            if graph.is_connected(m) and graph.is_convex(m):
                for b in (A, B):
                    cands.append(Candidate(graph.subgraph(m), b))
    return cands


def boundary_fn(seed):
    r = random.Random(seed)
    table = {(a, b): r.uniform(0, 3) for a in ("fake-a", "fake-b") for b in ("fake-a", "fake-b")}
    return lambda a, b, nbytes: table[(a, b)]


def brute_force(graph, cands, costs, boundary):
    """Plain recursion over the DP's own rule (no memo, no Dijkstra): an independent check."""
    full = graph.all_mask
    best = [float("inf")]

    def rec(covered, owner, acc):
        if acc >= best[0]:
            return
        if covered == full:
            best[0] = acc
            return
        u = next(i for i in range(len(graph)) if not covered >> i & 1)
        for c, cost in zip(cands, costs):
            m = c.subgraph.mask
            if cost is None or not m >> u & 1 or m & covered:
                continue
            ext = 0
            for i in iter_bits(m):
                ext |= graph.pred_mask[i]
            if ext & ~m & ~covered:
                continue
            b = sum(boundary(owner[graph.producer[t]], c.backend.name, 0)
                    for t in c.subgraph.inputs if t in graph.producer)
            new_owner = dict(owner)
            for i in iter_bits(m):
                new_owner[i] = c.backend.name
            rec(covered | m, new_owner, acc + cost + b)

    rec(0, {}, 0.0)
    return best[0]


def all_acyclic_covers(graph, cands, costs, boundary):
    """Every set of disjoint candidates covering the graph with an acyclic partition graph (tiny graphs)."""
    best = float("inf")
    usable = [(c, k) for c, k in zip(cands, costs) if k is not None]
    full = graph.all_mask

    def rec(start, covered, chosen):
        nonlocal best
        if covered == full:
            owner = {}
            for idx, (c, _) in enumerate(chosen):
                for i in iter_bits(c.subgraph.mask):
                    owner[i] = idx
            # acyclic partition graph?
            deps = {idx: {owner[p] for i in iter_bits(c.subgraph.mask) for p in graph.preds[i]} - {idx}
                    for idx, (c, _) in enumerate(chosen)}
            done, progress = set(), True
            while progress:
                progress = False
                for k, d in deps.items():
                    if k not in done and d <= done:
                        done.add(k)
                        progress = True
            if len(done) != len(chosen):
                return
            total = sum(k for _, k in chosen)
            for idx, (c, _) in enumerate(chosen):
                for t in c.subgraph.inputs:
                    if t in graph.producer:
                        total += boundary(chosen[owner[graph.producer[t]]][0].backend.name, c.backend.name, 0)
            best = min(best, total)
            return
        u = next(i for i in range(len(graph)) if not covered >> i & 1)
        for c, k in usable:
            m = c.subgraph.mask
            if m >> u & 1 and not m & covered:
                rec(0, covered | m, chosen + [(c, k)])

    rec(0, 0, [])
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dp_matches_brute_force_on_random_dags(seed):
    g = random_dag(7, seed)
    cands = all_candidates(g)
    r = random.Random(seed)
    costs = [None if r.random() < 0.1 and len(c.subgraph) > 1 else r.uniform(1, 10) for c in cands]
    bnd = boundary_fn(seed)
    res = solve(g, cands, costs, bnd)
    assert res.cost == pytest.approx(brute_force(g, cands, costs, bnd))
    # the chosen candidates cover the graph exactly, in an executable order
    covered = 0
    for c in res.choice:
        assert not c.subgraph.mask & covered
        ext = 0
        for i in iter_bits(c.subgraph.mask):
            ext |= g.pred_mask[i]
        assert not ext & ~c.subgraph.mask & ~covered
        covered |= c.subgraph.mask
    assert covered == g.all_mask
    assert not res.limit_hit


@pytest.mark.parametrize("seed", range(6))
def test_dp_is_optimal_over_all_acyclic_covers_of_a_chain(seed):
    # on a chain, every acyclic cover is reachable by the DP's rule
    g = from_onnx(chain_model())
    g2 = random_dag(6, 100 + seed)
    for graph in (g,) if seed % 2 else (g, g2):
        if graph is g2 and any(len(graph.preds[i]) > 1 for i in range(len(graph))):
            continue
        cands = all_candidates(graph, max_size=3)
        r = random.Random(seed)
        costs = [r.uniform(1, 10) for _ in cands]
        bnd = boundary_fn(seed)
        assert solve(graph, cands, costs, bnd).cost == pytest.approx(all_acyclic_covers(graph, cands, costs, bnd))


def test_boundary_costs_change_the_choice():
    # two nodes; B is cheaper per node, but a hand-off A->B costs a lot
    g = from_onnx(chain_model())
    cands = all_candidates(g, max_size=1)
    costs = [1.0 if c.backend is A else 0.9 for c in cands]
    free = solve(g, cands, costs)
    assert {c.backend.name for c in free.choice} == {"fake-b"}
    costs2 = [1.0 if c.backend is A else (0.9 if c.subgraph.mask != 1 else 5.0) for c in cands]
    pricey = solve(g, cands, costs2, lambda a, b, n: 10.0 if a != b else 0.0)
    assert {c.backend.name for c in pricey.choice} == {"fake-a"}  # no switch pays off
    cheap = solve(g, cands, costs2, lambda a, b, n: 0.0)
    assert [c.backend.name for c in cheap.choice][0] == "fake-a" and "fake-b" in {c.backend.name for c in cheap.choice}


def test_state_limit_falls_back_and_reports():
    g = random_dag(7, 3)
    cands = all_candidates(g)
    r = random.Random(0)
    costs = [r.uniform(1, 10) for _ in cands]
    exact = solve(g, cands, costs, boundary_fn(0))
    limited = solve(g, cands, costs, boundary_fn(0), max_states=3)
    assert limited.limit_hit and not exact.limit_hit
    assert limited.cost >= exact.cost - 1e-9
    assert sum(bin(c.subgraph.mask).count("1") for c in limited.choice) == len(g)


def test_no_cover_is_a_clear_error():
    g = from_onnx(chain_model())
    cands = [c for c in all_candidates(g, max_size=1) if c.subgraph.mask != 1]
    with pytest.raises(NoCoverError, match="no combination"):
        solve(g, cands, [1.0] * len(cands))
