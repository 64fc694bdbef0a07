"""The registry, the pattern language, and the region backends (onnxruntime, openvino) on the zoo."""

import importlib.metadata

import numpy as np
import pytest

from collage_ml.backends import base
from collage_ml.backends.base import Backend, get_backend, registered, resolve_backends, to_numpy
from collage_ml.backends.patterns import OpPattern, RegionPattern, _grow, step
from collage_ml.errors import BackendError
from collage_ml.ir import from_onnx, import_model, zoo
from tests.helpers import assert_compiled_matches_reference, chain_model

TINY = [n for n in zoo.names() if n.endswith("-tiny")]


def test_registry_lists_cpu_backends():
    names = registered()
    for n in ("onnxruntime", "openvino", "torch", "inductor", "tvm"):
        assert n in names
    assert get_backend("onnxruntime").available()


def test_unknown_backend_suggests():
    with pytest.raises(BackendError, match="did you mean onnxruntime"):
        get_backend("onnxruntim")


def test_missing_package_reports_unavailable_with_hint(monkeypatch):
    class Missing(Backend):
        name = "missing"
        install_hint = "pip install not-a-real-package"

        def _probe(self):
            import not_a_real_package_xyz  # noqa: F401

        def _version(self):
            return "0"

        patterns = ()

        def supports(self, graph, node):
            return True

        def compile(self, sg, threads=1):
            raise AssertionError

    b = Missing()
    assert not b.available()
    assert "pip install not-a-real-package" in b.unavailable_reason()
    assert b.version == "unavailable"
    monkeypatch.setitem(base._FACTORIES, "missing", Missing)
    monkeypatch.delitem(base._INSTANCES, "missing", raising=False)
    with pytest.raises(BackendError, match="'missing' is unavailable.*not-a-real-package"):
        resolve_backends("missing")


def test_entry_point_plugin(monkeypatch):
    ep = importlib.metadata.EntryPoint(
        "plugged", "tests.fake_backends:WrongNumbersFixture", base.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(base, "_ENTRY_POINTS_LOADED", False)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [ep] if group == base.ENTRY_POINT_GROUP else [])
    monkeypatch.delitem(base._FACTORIES, "plugged", raising=False)
    try:
        assert "plugged" in registered()
        assert get_backend("plugged").name == "test-wrong-numbers"
    finally:
        base._FACTORIES.pop("plugged", None)
        base._INSTANCES.pop("plugged", None)


def test_op_pattern_sequences():
    g = from_onnx(chain_model())  # MatMul Relu Add {Sigmoid Tanh} Mul
    p = OpPattern("mm", (step("MatMul"), step("Relu", optional=True), step("Add", optional=True)))
    assert sorted(p.matches(g, lambda n: True)) == [0b1, 0b11, 0b111]
    # the Add's output has two consumers, so nothing fuses past it
    q = OpPattern("add", (step("Add"), step("Sigmoid")))
    assert list(q.matches(g, lambda n: True)) == []
    # an unsupported node breaks the chain
    assert sorted(p.matches(g, lambda n: n.op_type != "Relu")) == [0b1]
    with pytest.raises(ValueError):
        OpPattern("bad", (step("Relu", optional=True),))


def test_esu_enumerates_each_connected_set_once():
    g = import_model("nasnet-tiny")
    n = min(len(g), 40)
    ok = (1 << n) - 1
    seen = []
    for a in range(n):
        seen.extend(_grow(g, ok, a, 3))
    assert len(seen) == len(set(seen))
    brute = {m for m in seen}
    # every connected set of size <= 2 among the first n nodes is found
    for i in range(n):
        assert 1 << i in brute
        for j in g.succs[i]:
            if j < n:
                assert (1 << i | 1 << j) in brute


def test_region_pattern_yields_convex_connected_sets_and_the_whole_model():
    g = import_model("bert-tiny")
    masks = list(RegionPattern("r", max_size=3, max_regions=300).matches(g, lambda n: True))
    assert masks[0] == g.all_mask  # the maximal region comes first, whatever the bound
    for m in masks[1:]:
        assert bin(m).count("1") <= 3 and g.is_convex(m) and g.is_connected(m)


@pytest.mark.parametrize("backend_name", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("model", TINY)
def test_region_backends_match_reference(backend_name, model):
    b = get_backend(backend_name)
    if not b.available():
        pytest.skip(b.unavailable_reason())
    g = import_model(model)
    ref = g.reference()
    masks = list(RegionPattern("r", max_size=4, max_regions=40).matches(g, lambda n: b.supports(g, n)))
    picked = masks[:1] + masks[1:: max(1, len(masks) // 4)][:4]
    for mask in picked:
        assert_compiled_matches_reference(b, g, ref, mask, 1, f"{backend_name} {model}")


def test_region_backends_accept_torch_tensors():
    import torch

    g = from_onnx(chain_model())
    x = torch.randn(1, 8)
    want = g.reference({"x": x.numpy()})["y"]
    for name in ("onnxruntime", "openvino"):
        b = get_backend(name)
        if b.available():
            (y,) = b.compile(g.whole())(x)
            np.testing.assert_allclose(to_numpy(y), want, rtol=1e-5, atol=1e-6)


def test_openvino_outputs_are_not_overwritten_by_the_next_call():
    """OpenVINO writes each call's outputs straight into fresh arrays: an earlier result must survive
    the next call (a reused request buffer would silently change it)."""
    b = get_backend("openvino")
    if not b.available():
        pytest.skip(b.unavailable_reason())
    from onnx import TensorProto, helper

    from collage_ml.backends import openvino_backend

    shape = [256, 256]  # a 256 KiB float32 output: written in place
    assert 256 * 256 * 4 >= openvino_backend.ZERO_COPY_MIN_BYTES
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]), opset_imports=[helper.make_opsetid("", 17)])
    g = from_onnx(m)
    exe = b.compile(g.whole())
    assert exe._out_specs is not None
    x1 = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x2 = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (y1,) = exe(x1)
    kept = np.array(y1, copy=True)
    (y2,) = exe(x2)
    np.testing.assert_array_equal(y1, kept)
    np.testing.assert_allclose(y1, g.reference({"x": x1})["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, g.reference({"x": x2})["y"], rtol=1e-5, atol=1e-6)
    assert not np.shares_memory(y1, y2)


def test_from_spec_rebuilds_registered_backends_only():
    b = get_backend("onnxruntime[opt=basic]")
    again = Backend.from_spec(b.spec())
    assert type(again) is type(b) and again.name == b.name and again.config == b.config
    from tests.fake_backends import WrongNumbersFixture

    spec = WrongNumbersFixture().spec()  # a test fixture: importable, never registered
    with pytest.raises(BackendError, match="not a registered backend"):
        Backend.from_spec(spec)
    with pytest.raises(BackendError, match="not a registered backend"):
        Backend.from_spec(("no_such_module_collage", "Anything", {}))  # looked up, never imported
    assert type(Backend.from_spec(spec, trusted=True)) is WrongNumbersFixture  # a process's own workers
    with pytest.raises(BackendError, match="not a Backend class"):
        Backend.from_spec(("collections", "OrderedDict", {}), trusted=True)
    with pytest.raises(BackendError, match="not a backend spec"):
        Backend.from_spec(["onnxruntime"])


def test_partition_resolves_its_backend():
    from collage_ml.plan import Partition

    b = get_backend("onnxruntime[spin=on]")
    assert Partition(b.name, [0]).resolve_backend() is b  # by registered name
    built = Partition(b.name, [0], backend_spec=b.spec()).resolve_backend()  # from the in-memory spec
    assert type(built) is type(b) and built.name == b.name
    with pytest.raises(BackendError, match="unknown backend"):
        Partition("no-such-backend", [0]).resolve_backend()
