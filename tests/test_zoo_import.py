"""The zoo through the importer: every model exports, imports and cuts into runnable subgraphs."""

import numpy as np
import onnx
import pytest

from collage_ml.ir import import_model, zoo
from collage_ml.ir.reference import run_onnx
from tests.helpers import random_convex_masks

TINY = zoo.names(include_tiny=True)
TINY = [n for n in TINY if n.endswith("-tiny")]

# ONNX node counts of the full-size models at batch 1 (dynamo exporter, torch 2.13, BatchNorm folded)
FULL_NODE_COUNTS = {
    "bert": 232,
    "dcgan": 11,
    "nasnet": 198,
    "resnext50": 116,
    "resnet3d50": 116,
    "resnet50": 122,
    "mobilenetv2": 100,
    "nasrnn": 235,
}


def test_zoo_covers_the_collage_evaluation():
    assert set(FULL_NODE_COUNTS) == set(zoo.names(include_tiny=False))
    assert {n[: -len("-tiny")] for n in TINY} == set(FULL_NODE_COUNTS)


@pytest.mark.parametrize("name", TINY)
def test_random_convex_subgraphs_export_and_match_reference(name):
    g = import_model(name)
    ref = g.reference()
    masks = random_convex_masks(g, count=6, max_size=6, seed=hash(name) % 1000)
    assert masks
    for mask in masks:
        sg = g.subgraph(mask)
        model = sg.to_onnx()  # runs onnx.checker
        feeds, expected = sg.reference_io(ref)
        got = run_onnx(model, feeds)
        for t, want in expected.items():
            np.testing.assert_allclose(got[t], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} {sg} {t}")


@pytest.mark.parametrize("name", TINY)
def test_tiny_whole_model_matches_torch(name):
    import torch

    module, inputs = zoo.build(name)
    g = import_model(name)
    feeds = {n: x.numpy() for n, x in zip(g.input_names, inputs)}
    ref = g.reference(feeds)
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for t, w in zip(g.output_names, want):
        np.testing.assert_allclose(ref[t], w.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FULL_NODE_COUNTS))
def test_full_size_models_export_and_import(name):
    g = import_model(name)
    assert len(g) == FULL_NODE_COUNTS[name]
    onnx.checker.check_model(g.model)
    assert all(g.tensors[t].shape for n in g.nodes for t in n.outputs if t) or name == "nasrnn"
    assert g.tensors[g.input_names[0]].shape[0] == 1


def test_batch_size_reaches_the_graph():
    g = import_model("resnet50-tiny", batch=3)
    assert g.tensors[g.input_names[0]].shape[0] == 3
    assert g.tensors[g.output_names[0]].shape[0] == 3
