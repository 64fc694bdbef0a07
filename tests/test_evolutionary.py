"""The graph-level search with a synthetic super-additive cost: fused regions beat the sum of their parts."""

from onnx import TensorProto, helper

from collage_ml.ir import from_onnx
from collage_ml.plan import Partition, Plan
from collage_ml.search.evolutionary import KEEP, EvoConfig, GraphLevelSearch


def chain(n: int):
    nodes = [helper.make_node("Relu" if i % 2 else "Sigmoid", [f"t{i - 1}" if i else "x"], [f"t{i}"]) for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT, [1, 4])])
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def op_plan(graph):
    """What the DP picks under additive costs: every node alone on the library backend 'lib'."""
    return Plan("chain", [Partition("lib", [i]) for i in range(len(graph))], graph_hash=graph.whole().hash)


def synthetic(graph, calls):
    """Super-additive: a 'fuser' region costs 1 + 0.1/node (one launch for the whole region); 'lib' 1/node.
    'fuser' cannot run the last node. Sum-of-parts estimates see 'fuser' at 1.1/node, worse than 'lib'."""
    last = len(graph) - 1

    def fitness(plan):
        calls.append(plan.canonical())
        total = 0.0
        for p in plan.partitions:
            if p.backend == "fuser":
                if last in p.nodes:
                    return None, "fuser cannot run the last node"
                total += 1.0 + 0.1 * len(p.nodes)
            else:
                total += 1.0 * len(p.nodes)
        return total, ""

    def estimate(plan):
        return sum((1.1 if p.backend == "fuser" else 1.0) * len(p.nodes) for p in plan.partitions)

    return fitness, estimate


def run(graph, seed=0, **kw):
    calls = []
    fitness, estimate = synthetic(graph, calls)
    cfg = EvoConfig(population=10, generations=12, measure_per_generation=4, random_seeds=4, seed=seed, **kw)
    res = GraphLevelSearch(graph, op_plan(graph), ["fuser"], fitness, estimate, cfg).run()
    return res, calls


def test_finds_the_fused_plan_the_dp_cannot_see():
    g = chain(6)
    res, _ = run(g)
    # the op-level plan costs 6; the best plan fuses nodes 0-4 on 'fuser' (1.5) and keeps node 5 (1.0)
    assert res.best.seconds == 2.5
    parts = sorted((p.backend, tuple(sorted(p.nodes))) for p in res.best.plan.partitions)
    assert parts == [("fuser", (0, 1, 2, 3, 4)), ("lib", (5,))]
    assert res.best.genome[:5] == ("fuser",) * 5 and res.best.genome[5] in (KEEP, "lib")


def test_memoisation_never_measures_a_plan_twice():
    g = chain(6)
    res, calls = run(g)
    assert len(calls) == len(set(calls)) == res.e2e_measurements
    assert len(res.proposed) > len(calls)  # many proposals were duplicates or pruned


def test_only_the_best_estimates_are_measured_per_generation():
    g = chain(8)
    res, calls = run(g, seed=3)
    per_gen = {}
    for e in res.evaluated:
        per_gen[e.generation] = per_gen.get(e.generation, 0) + 1
    assert all(v <= 4 for k, v in per_gen.items() if k > 0)


def test_same_seed_same_sequence():
    g = chain(7)
    a, ca = run(g, seed=5)
    b, cb = run(g, seed=5)
    assert a.proposed == b.proposed and ca == cb
    c, _ = run(g, seed=6)
    assert c.proposed != a.proposed


def test_budget_stops_the_search():
    g = chain(6)
    res, _ = run(g, budget_seconds=0.0)
    assert res.generations == 0 and res.best is not None
