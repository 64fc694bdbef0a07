"""Tests of the model zoo (collage_ml.ir.zoo): tiny variants only, kept fast.

Full-size models are exercised elsewhere (they take seconds each to export).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from collage_ml.errors import CollageError, UnknownModelError
from collage_ml.ir import zoo

TINY = [n for n in zoo.names() if n.endswith("-tiny")]
FAMILIES = ["bert", "dcgan", "nasnet", "resnext50", "resnet3d50", "resnet50", "mobilenetv2", "nasrnn"]

# ONNX op types each tiny model's export must contain (the family's characteristic ops).
EXPECTED_OPS = {
    "bert-tiny": {"MatMul", "Softmax", "LayerNormalization", "Transpose"},
    "dcgan-tiny": {"ConvTranspose", "Relu", "Tanh"},
    "nasnet-tiny": {"Conv", "AveragePool", "MaxPool", "Add", "Concat"},
    "resnext50-tiny": {"Conv", "Relu", "Add"},
    "resnet3d50-tiny": {"Conv", "Relu", "Add"},
    "resnet50-tiny": {"Conv", "MaxPool", "Add"},
    "mobilenetv2-tiny": {"Conv", "Clip", "Add"},
    "nasrnn-tiny": {"Sigmoid", "Tanh", "Relu", "Mul", "Add"},
}


def _run(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs)


def _convs(model: torch.nn.Module) -> list[torch.nn.modules.conv._ConvNd]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]


# Torch-level structure each tiny model must have (exporter-independent).
STRUCTURE = {
    "bert-tiny": lambda m: any(isinstance(x, torch.nn.LayerNorm) for x in m.modules())
    and not any(isinstance(x, torch.nn.MultiheadAttention) for x in m.modules()),
    "dcgan-tiny": lambda m: any(isinstance(x, torch.nn.ConvTranspose2d) for x in m.modules())
    and any(isinstance(x, torch.nn.BatchNorm2d) for x in m.modules()),
    "nasnet-tiny": lambda m: any(c.groups == c.in_channels > 1 for c in _convs(m))
    and {5, 7} <= {c.kernel_size[0] for c in _convs(m)},
    "resnext50-tiny": lambda m: any(1 < c.groups < c.in_channels for c in _convs(m)),
    "resnet3d50-tiny": lambda m: any(isinstance(x, torch.nn.Conv3d) for x in m.modules())
    and any(isinstance(x, torch.nn.BatchNorm3d) for x in m.modules()),
    "resnet50-tiny": lambda m: any(isinstance(x, torch.nn.MaxPool2d) for x in m.modules())
    and any(isinstance(x, torch.nn.Linear) for x in m.modules()),
    "mobilenetv2-tiny": lambda m: any(c.groups == c.in_channels > 1 for c in _convs(m))
    and any(isinstance(x, torch.nn.ReLU6) for x in m.modules()),
    "nasrnn-tiny": lambda m: any(isinstance(x, torch.nn.Linear) for x in m.modules())
    and not any(isinstance(x, torch.nn.RNNBase) for x in m.modules()),
}


# --- registry -------------------------------------------------------------------------


def test_registry_lists_every_family_full_and_tiny():
    assert zoo.names(include_tiny=False) == FAMILIES
    assert sorted(zoo.names()) == sorted(FAMILIES + [f + "-tiny" for f in FAMILIES])
    assert sorted(EXPECTED_OPS) == sorted(TINY) == sorted(STRUCTURE)
    for entry in zoo.entries():
        assert zoo.get(entry.name) is entry
        assert entry.tiny == entry.name.endswith("-tiny")
        assert entry.family == entry.name.removesuffix("-tiny")
        assert "\n" not in entry.description and "input [1, " in entry.description
    assert not any(e.tiny for e in zoo.entries(include_tiny=False))


def test_unknown_name_lists_suggestions():
    with pytest.raises(UnknownModelError) as info:
        zoo.get("resnet5")
    message = str(info.value)
    assert "'resnet50'" in message and "Did you mean" in message
    assert "mobilenetv2-tiny" in message  # the valid names are listed
    assert isinstance(info.value, CollageError)
    with pytest.raises(UnknownModelError):
        zoo.build("no-such-model")


@pytest.mark.parametrize("batch", [0, -1, 1.5, True, "2", None])
def test_bad_batch_is_rejected(batch):
    with pytest.raises(ValueError, match="batch"):
        zoo.build("dcgan-tiny", batch=batch)


# --- torch ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_runs_and_is_seeded(name):
    model, inputs = zoo.build(name, seed=0)
    assert not model.training
    assert STRUCTURE[name](model)
    assert inputs and all(x.dtype == torch.float32 and x.shape[0] == 1 for x in inputs)
    out = _run(model, inputs)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert out.abs().max() > 1e-3  # not degenerate

    model2, inputs2 = zoo.build(name, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(inputs, inputs2))
    assert torch.equal(_run(model2, inputs2), out)

    model3, inputs3 = zoo.build(name, seed=1)
    assert not all(torch.equal(a, b) for a, b in zip(inputs, inputs3))
    assert not torch.allclose(_run(model3, inputs), out)  # weights differ too


def test_build_leaves_global_rng_alone():
    state = torch.get_rng_state()
    zoo.build("resnet50-tiny", seed=3)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("name", TINY)
def test_batch_sets_leading_dim(name):
    model, inputs = zoo.build(name, batch=3)
    assert all(x.shape[0] == 3 for x in inputs)
    out3 = _run(model, inputs)
    out1 = _run(*zoo.build(name, batch=1))
    assert out3.shape == (3, *out1.shape[1:])
    # eval mode: sample 0 does not depend on the others in the batch
    torch.testing.assert_close(out3[:1], _run(model, tuple(x[:1] for x in inputs)), atol=1e-5, rtol=1e-4)


# --- ONNX export (dynamo) + onnxruntime --------------------------------------------------


# torch's exporter internals emit a FutureWarning about pytree LeafSpec; not ours.
ignore_exporter_warnings = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


@functools.cache
def _exported(name: str) -> tuple[onnx.ModelProto, tuple[torch.Tensor, ...], torch.Tensor]:
    """(ONNX model exported in memory with the dynamo exporter, inputs, torch output), batch 2."""
    model, inputs = zoo.build(name, batch=2)
    program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    return program.model_proto, inputs, _run(model, inputs)


@ignore_exporter_warnings
@pytest.mark.parametrize("name", TINY)
def test_tiny_model_exports_and_matches_onnxruntime(name):
    proto, inputs, expected = _exported(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert len(session.get_inputs()) == len(inputs)
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    (actual,) = session.run(None, feeds)
    np.testing.assert_allclose(actual, expected.numpy(), atol=1e-4, rtol=1e-3)


@ignore_exporter_warnings
@pytest.mark.parametrize("name", TINY)
def test_tiny_export_has_characteristic_ops(name):
    proto, _, _ = _exported(name)
    ops = {node.op_type for node in proto.graph.node}
    assert EXPECTED_OPS[name] <= ops, f"missing {EXPECTED_OPS[name] - ops}"
    if name in ("resnext50-tiny", "mobilenetv2-tiny", "nasnet-tiny"):
        groups = [a.i for n in proto.graph.node if n.op_type == "Conv"
                  for a in n.attribute if a.name == "group"]
        assert max(groups, default=1) > 1  # grouped / depthwise convs survive export
