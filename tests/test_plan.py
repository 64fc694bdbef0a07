"""Plans and placed models: JSON, merging, validation, and mixed-backend numerics on the zoo."""

import json
import random

import numpy as np
import pytest

from collage_ml.backends import get_backend
from collage_ml.candidates import enumerate_candidates
from collage_ml.errors import CollageError, ModelError
from collage_ml.ir import from_onnx, import_model, zoo
from collage_ml.measure.timing import compare
from collage_ml.placed import load
from collage_ml.plan import Partition, Plan
from collage_ml.search.dp import solve
from tests.helpers import chain_model

TINY = [n for n in zoo.names() if n.endswith("-tiny")]


def mixed_plan(graph, backend_names, seed=0, max_size=3):
    """A plan that mixes the backends: the DP over real candidates with random costs."""
    backends = [get_backend(n) for n in backend_names]
    cands = list(enumerate_candidates(graph, backends, max_region_size=max_size))
    cands = [c for c in cands if len(c.subgraph) <= max_size]
    r = random.Random(seed)
    res = solve(graph, cands, [r.uniform(1, 2) * len(c.subgraph) ** 0.5 for c in cands])
    return Plan.from_candidates(graph, res.choice)


@pytest.mark.parametrize("model", TINY)
def test_mixed_plans_match_reference(model):
    g = import_model(model)
    names = ["onnxruntime", "openvino", "torch", "tvm"]
    plan = mixed_plan(g, names, seed=len(model))
    used = plan.backends_used()
    assert len(used) >= 2, used
    pm = plan.compile(g, threads=1)
    ref = g.reference()
    out = pm.run({n: ref[n] for n in g.input_names})
    from collage_ml.backends.base import to_numpy

    cmp = compare([to_numpy(out[n]) for n in g.output_names], ref, list(g.output_names))
    assert cmp.ok, cmp.detail


@pytest.mark.parametrize("model", ["dcgan-tiny", "resnet50-tiny"])
def test_mixed_plans_with_inductor_match_reference(model):
    g = import_model(model)
    plan = mixed_plan(g, ["inductor", "onnxruntime", "torch"], seed=1, max_size=4)
    assert "inductor" in plan.backends_used()
    pm = plan.compile(g, threads=1)
    ref = g.reference()
    got = pm(*[ref[n] for n in g.input_names])
    got = got if isinstance(got, tuple) else (got,)
    assert compare(list(got), ref, list(g.output_names)).ok


def test_plan_json_round_trip_and_validation():
    g = from_onnx(chain_model())
    plan = Plan("chain", [Partition("onnxruntime", [0, 1, 2]), Partition("torch", [3, 4, 5])], graph_hash=g.whole().hash)
    again = Plan.from_json(plan.to_json())
    assert again.canonical() == plan.canonical() and again.graph_hash == plan.graph_hash
    with pytest.raises(CollageError, match="not cover"):
        Plan("c", [Partition("onnxruntime", [0, 1])]).validate(g)
    with pytest.raises(CollageError, match="overlap"):
        Plan("c", [Partition("onnxruntime", [0, 1, 2, 3, 4, 5]), Partition("torch", [5])]).validate(g)
    with pytest.raises(CollageError, match="not convex"):
        Plan("c", [Partition("onnxruntime", [0, 1, 2, 3, 5]), Partition("torch", [4])]).validate(g)
    with pytest.raises(CollageError, match="different model"):
        Plan("c", [Partition("onnxruntime", list(range(6)))], graph_hash="0" * 40).validate(g)
    with pytest.raises(CollageError, match="not a collage-ml plan"):
        Plan.from_json('{"format": 1}')
    with pytest.raises(CollageError, match="unsupported plan format"):
        Plan.from_json('{"format": 99}')


def test_adjacent_region_partitions_merge_when_convex():
    g = from_onnx(chain_model())  # 0 MatMul 1 Relu 2 Add 3 Sigmoid 4 Tanh 5 Mul
    plan = Plan("c", [Partition("onnxruntime", [0]), Partition("onnxruntime", [1]), Partition("torch", [2]),
                      Partition("onnxruntime", [3]), Partition("onnxruntime", [4]), Partition("onnxruntime", [5])])
    merged = plan.merged(g, {"onnxruntime"})
    assert sorted(sorted(p.nodes) for p in merged.partitions) == [[0, 1], [2], [3, 4, 5]]
    # op-level backends are not merged
    assert len(plan.merged(g, set()).partitions) == 6
    # Sigmoid and Mul alone would not be convex without Tanh
    p2 = Plan("c", [Partition("onnxruntime", [0, 1, 2]), Partition("onnxruntime", [3]), Partition("torch", [4]),
                    Partition("onnxruntime", [5])])
    m2 = p2.merged(g, {"onnxruntime"})
    assert [3] in [sorted(p.nodes) for p in m2.partitions] or [0, 1, 2, 3] in [sorted(p.nodes) for p in m2.partitions]
    for p in m2.partitions:
        assert g.is_convex(p.mask)


def test_placed_model_io_and_save_load(tmp_path):
    import torch

    g = import_model("resnet50-tiny")
    plan = mixed_plan(g, ["onnxruntime", "torch"], seed=3)
    pm = plan.compile(g, threads=1)
    ref = g.reference()
    x = ref[g.input_names[0]]
    y_np = pm(x)
    assert isinstance(y_np, np.ndarray)
    y_t = pm(torch.from_numpy(x))
    assert isinstance(y_t, torch.Tensor)
    np.testing.assert_allclose(y_t.numpy(), y_np, rtol=1e-6)
    np.testing.assert_allclose(pm(**{g.input_names[0]: x}), y_np)
    with pytest.raises(TypeError, match="expected 1 input"):
        pm(x, x)
    pm.save(tmp_path / "pm")
    again = load(tmp_path / "pm")
    assert again.plan.canonical() == pm.plan.canonical()
    np.testing.assert_allclose(again(x), y_np, rtol=1e-6)
    with pytest.raises(ModelError, match="not a saved placed model"):
        load(tmp_path)
