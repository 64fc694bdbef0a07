import numpy as np
import onnx
import pytest

from collage_ml.errors import ModelError
from collage_ml.ir import from_onnx, import_model
from tests.helpers import chain_model


def test_topological_order_and_edges():
    g = from_onnx(chain_model(order=[5, 3, 4, 2, 1, 0]))
    assert [n.op_type for n in g.nodes][:3] == ["MatMul", "Relu", "Add"]
    assert [n.op_type for n in g.nodes][-1] == "Mul"
    for n in g.nodes:
        assert all(p < n.index for p in g.preds[n.index])


def test_hash_ignores_names_order_and_weight_values():
    base = from_onnx(chain_model())
    renamed = from_onnx(
        chain_model(names={k: f"T{k}_renamed" for k in "x W b mm r a s t y".split()}, seed=7, order=[0, 1, 2, 4, 3, 5])
    )
    assert base.whole().hash == renamed.whole().hash
    # a sub-block: Add -> {Sigmoid, Tanh} -> Mul
    assert base.subgraph([2, 3, 4, 5]).hash == renamed.subgraph([2, 3, 4, 5]).hash


def test_hash_changes_with_shape_op_or_wiring():
    base = from_onnx(chain_model()).whole().hash
    assert from_onnx(chain_model(width=16)).whole().hash != base
    m = chain_model()
    m.graph.node[3].op_type = "Relu"  # Sigmoid -> Relu
    assert from_onnx(m).whole().hash != base
    m = chain_model()
    m.graph.node[5].input[:] = ["t", "s"]  # operands swapped
    assert from_onnx(m).whole().hash != base


def test_convexity_matches_definition():
    g = from_onnx(chain_model())
    # 0 MatMul 1 Relu 2 Add 3 Sigmoid 4 Tanh 5 Mul
    assert g.is_convex(0b000011)
    assert not g.is_convex(0b101100)  # Add -> Tanh -> Mul leaves the set and comes back
    assert g.is_convex(0b111100)
    assert not g.is_convex(0b000101)  # MatMul -> Relu -> Add

    def naive(mask):
        # a node outside the set reachable from it that also reaches it
        def reach(i):
            seen, stack = set(), [i]
            while stack:
                for s in g.succs[stack.pop()]:
                    if s not in seen:
                        seen.add(s)
                        stack.append(s)
            return seen

        members = {i for i in range(len(g)) if mask >> i & 1}
        for m in members:
            for v in reach(m) - members:
                if reach(v) & members:
                    return False
        return True

    for mask in range(1, 1 << len(g)):
        assert g.is_convex(mask) == naive(mask), bin(mask)


def test_subgraph_rejects_non_convex():
    g = from_onnx(chain_model())
    with pytest.raises(ValueError, match="not convex"):
        g.subgraph([2, 3, 5])


def test_boundaries_and_to_onnx_numerics():
    g = from_onnx(chain_model())
    sg = g.subgraph([2, 3, 4])
    assert sg.inputs == ("r",)
    assert set(sg.outputs) == {"s", "t"}
    assert sg.constants == ("b",)
    m = sg.to_onnx()
    onnx.checker.check_model(m)
    ref = g.reference()
    feeds, expected = sg.reference_io(ref)
    from collage_ml.ir.reference import run_onnx

    got = run_onnx(m, feeds)
    for k, v in expected.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6)


def test_reference_captures_every_tensor_and_is_seeded():
    g = from_onnx(chain_model())
    ref = g.reference(seed=1)
    assert set(ref) >= {"x", "mm", "r", "a", "s", "t", "y"}
    x = ref["x"]
    np.testing.assert_allclose(ref["y"], 1 / (1 + np.exp(-ref["a"])) * np.tanh(ref["a"]), rtol=1e-5)
    assert not np.array_equal(g.reference(seed=2)["x"], x)
    np.testing.assert_array_equal(g.reference(seed=1)["x"], x)


def test_reference_rejects_wrong_inputs():
    g = from_onnx(chain_model())
    with pytest.raises(ModelError, match="unknown input"):
        g.reference({"nope": np.zeros((1, 8), np.float32)})


def test_dynamic_input_must_be_pinned():
    m = chain_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    with pytest.raises(ModelError, match=r"dynamic shape \['N', 8\].*input_shapes"):
        from_onnx(m)
    g = from_onnx(m, input_shapes={"x": [3, 8]})
    assert g.tensors["y"].shape == (3, 8)


def test_shapes_unknown_to_static_inference_are_observed():
    # Reshape to a shape computed at run time: static inference leaves it unknown.
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["p"], keepdims=1),
        helper.make_node("Reshape", ["x", "p"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    g = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert g.tensors["y"].shape == (24,)


@pytest.mark.parametrize(
    "payload, message",
    [(b"", "not a readable ONNX model"), (b"\x08\x07garbage" * 10, "not a readable ONNX model")],
)
def test_malformed_onnx_file(tmp_path, payload, message):
    p = tmp_path / "bad.onnx"
    p.write_bytes(payload)
    with pytest.raises(ModelError, match=message):
        import_model(str(p))


def test_truncated_onnx_file(tmp_path):
    p = tmp_path / "trunc.onnx"
    p.write_bytes(chain_model().SerializeToString()[:-40])
    with pytest.raises(ModelError, match="trunc.onnx"):
        import_model(str(p))


def test_missing_file_and_unknown_object():
    with pytest.raises(ModelError, match="no such file"):
        import_model("/nonexistent/model.onnx")
    with pytest.raises(ModelError, match="cannot import a int"):
        import_model(42)


def test_torch_module_import_and_errors():
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.tanh(self.lin(x))

    net = Net().eval()
    x = torch.randn(2, 4)
    g = import_model(net, (x,))
    (out,) = g.output_names
    ref = g.reference({g.input_names[0]: x.numpy()})
    np.testing.assert_allclose(ref[out], net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ModelError, match="needs example_inputs"):
        import_model(net)

    class Bad(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")  # no exporter can trace this

    with pytest.raises(ModelError, match="could not export Bad"):
        import_model(Bad(), (x,))


def test_unknown_zoo_name_suggests():
    from collage_ml.errors import UnknownModelError

    with pytest.raises(UnknownModelError, match="resnet50"):
        import_model("resnet5")
