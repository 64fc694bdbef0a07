"""Synthetic networks (collage_ml.ir.zoo.synthetic): seeded, varied, importable, and named in collect."""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import pytest
import torch

from collage_ml.collector.sources import model_family, resolve_models
from collage_ml.errors import UnknownModelError
from collage_ml.featurize.info import subgraph_info
from collage_ml.featurize.roofline import constant_nodes
from collage_ml.featurize.schema import OPS
from collage_ml.ir import import_model, zoo
from collage_ml.ir.zoo import synthetic, synthetic_v2, synthetic_v3, synthetic_v4, synthetic_v5


def test_naming_a_synthetic_network_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    zoo.get("synthetic-1234")  # draws the network's shapes, not its weights
    assert torch.equal(torch.random.get_rng_state(), state)


def test_the_same_seed_is_the_same_network_and_other_seeds_differ():
    a, (x,) = zoo.build("synthetic-3", batch=2, seed=0)
    b, (y,) = zoo.build("synthetic-3", batch=2, seed=0)
    assert torch.equal(x, y)
    with torch.no_grad():
        assert torch.equal(a(x), b(y))
    descriptions = {zoo.get(f"synthetic-{i}").description for i in range(12)}
    assert len(descriptions) >= 8  # drawn, not one network


def test_the_vocabulary_covers_every_domain_and_the_blocks_the_zoo_lacks_elsewhere():
    """Over 40 seeds: all three domains, and transposed and 3-D convolutions, depthwise convolutions,
    attention and LayerNorm each appear in several networks."""
    domains = collections.Counter(zoo.get(f"synthetic-{i}").description.split()[1] for i in range(40))
    assert set(domains) == {"image", "sequence", "volume"} and min(domains.values()) >= 3
    have = collections.Counter()
    for i in range(40):
        m, _ = zoo.build(f"synthetic-{i}")
        kinds = {type(x).__name__ for x in m.modules()}
        kinds |= {"Depthwise" for x in m.modules() if isinstance(x, torch.nn.Conv2d) and x.groups == x.in_channels > 1}
        have.update(kinds)
    for kind in ("ConvTranspose2d", "Conv3d", "Depthwise", "_Attention", "LayerNorm", "MaxPool2d", "_Gated"):
        assert have[kind] >= 2, (kind, have[kind])


def test_a_synthetic_network_imports_and_its_reference_is_finite():
    g = import_model("synthetic-1", batch=2)
    ref = g.reference()
    outs = [ref[t] for t in g.output_names]
    assert outs and all(np.isfinite(o).all() and o.shape[0] == 2 for o in outs)
    assert 5 <= len(g.nodes) <= 200


def test_synthetic_names_resolve_in_collect_and_stay_out_of_the_zoo_listing():
    before = zoo.names()
    assert resolve_models("synthetic:3") == ["synthetic-0", "synthetic-1", "synthetic-2"]
    assert resolve_models("synthetic:5-7,synthetic-9") == ["synthetic-5", "synthetic-6", "synthetic-9"]
    assert model_family("synthetic-5") == synthetic.FAMILY == "synthetic"
    assert zoo.names() == before  # drawing networks does not change what "all" means
    for bad in ("synthetic:0", "synthetic:5-2", "synthetic:x"):
        with pytest.raises(ValueError, match="bad synthetic range"):
            resolve_models(bad)
    with pytest.raises(UnknownModelError, match="synthetic-<seed>"):
        zoo.get("synthetic-x")


@pytest.mark.parametrize("seeds, digest, name, nodes, graph_hash", [
    (range(60), "a57aeff5d75d8930", "synthetic-1", 18, "de51f00a528cf6a97f134eded45b83eba84cea30"),
    (range(1000, 1030), "2a126f5c0cce51dd", "synthetic-1000", 54, "018e3296c416571ff55224f2b7e1b7b9085bacfc"),
    (range(2000, 2030), "8fbdfc89a2cd211b", "synthetic-2000", 43, "c164dd8ad2b97b313d5e1932dfc80bd4e10a9e85"),
    (range(3000, 3030), "1d547cacfc233f4c", "synthetic-3001", 54, "4dd04a8ac2740273ee1fd4f2cf782931ee2f8904"),
    (range(4000, 4030), "72a8fc4dbc91f6fc", "synthetic-4002", 41, "9ccf96cc4da55ac4fce23d6f9b235a291e49d78c"),
])
def test_every_vocabulary_is_frozen(seeds, digest, name, nodes, graph_hash):
    """Datasets name synthetic networks by seed (synthetic:60, synthetic:1000-1030 and synthetic:2000-2030 on
    the Xeon, 2026-12-05): each seed must keep drawing the network it was measured on (the digest of the
    descriptions, and one network's graph: synthetic-1000's is the source hash its rows in
    cpu-2core-xeon-amx-synth-v2-m5 record)."""
    text = "\n".join(zoo.get(f"synthetic-{i}").description for i in seeds)
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == digest
    g = import_model(name)
    assert len(g.nodes) == nodes and g.whole().hash == graph_hash


def _kinds(m: torch.nn.Module) -> set[str]:
    out = set()
    for x in m.modules():
        if isinstance(x, torch.nn.Conv2d) and x.groups > 1:
            if x.groups == x.in_channels:
                out.add(f"depthwise {x.kernel_size[0]}x{x.kernel_size[0]} stride {x.stride[0]}")
            elif x.groups >= 4:
                out.add("grouped, 4 or more groups")
        elif isinstance(x, torch.nn.ConvTranspose2d):
            out.add(f"transposed stride {x.stride[0]}")
        elif isinstance(x, torch.nn.AvgPool2d) and x.stride == 1:
            out.add("average pool stride 1")
        else:
            out.add(type(x).__name__)
    return out


def test_the_second_vocabulary_draws_the_blocks_the_first_lacks():
    """Seeds from 1000 on: image networks with 5x5 and 7x7 and strided depthwise convolutions, many-group
    convolutions, transposed convolutions of stride 1 and 2, explicit padding and crops, stride-1 pooling."""
    assert synthetic_v2.FIRST_SEED == 1000
    have = collections.Counter()
    for i in range(1000, 1030):
        assert zoo.get(f"synthetic-{i}").description.startswith("synthetic image")
        m, _ = zoo.build(f"synthetic-{i}")
        have.update(_kinds(m))
    for kind in ("depthwise 5x5 stride 1", "depthwise 7x7 stride 1", "depthwise 7x7 stride 2",
                 "grouped, 4 or more groups", "transposed stride 1", "transposed stride 2", "ZeroPad2d", "_Crop",
                 "average pool stride 1", "_Cat", "Sum"):
        assert have[kind] >= 2, (kind, have[kind])


def test_a_second_vocabulary_network_imports_with_its_pads_and_slices():
    names = [f"synthetic-{i}" for i in range(1000, 1030)]
    name = next(n for n in names if "_Crop" in _kinds(zoo.build(n)[0]))
    g = import_model(name, batch=2)
    ops = {n.op_type for n in g.nodes}
    assert {"Pad", "Slice", "Conv"} <= ops, ops
    ref = g.reference()
    assert all(np.isfinite(ref[t]).all() and ref[t].shape[0] == 2 for t in g.output_names)


def _constant_ops(g) -> collections.Counter:
    """The op types of the nodes that read only weights, as the featurizer sees them (roofline.constant_nodes)."""
    info = subgraph_info(g.whole())
    return collections.Counter(OPS[o] for o in info.ops[constant_nodes(info)])


def test_the_third_vocabulary_draws_recurrent_cells_from_learned_states():
    """Seeds from 2000 on: Elman, GRU and LSTM cells unrolled from learned initial states, so the first step's
    hidden-state product is a Gemm of weights alone, which no network of the first two vocabularies has."""
    assert synthetic_v3.FIRST_SEED == 2000
    texts = [zoo.get(f"synthetic-{i}").description for i in range(2000, 2030)]
    for kind in ("elman", "gru", "lstm", "positions none", "positions raw", "positions projected"):
        assert sum(kind in t for t in texts) >= 2, kind
    g = import_model("synthetic-2001", batch=2)
    const = _constant_ops(g)
    assert const["Gemm"] >= 2, const  # the initial state's product and the projected positional table
    ref = g.reference()
    assert all(np.isfinite(ref[t]).all() and ref[t].shape[0] == 2 for t in g.output_names)
    assert not _constant_ops(import_model("synthetic-1"))["Gemm"]  # the first vocabulary has none


def test_the_fourth_vocabulary_draws_post_norm_encoders_whose_layernorms_carry_the_residual_stream():
    """Seeds from 3000 on: transformer encoders, post-norm in most (``LayerNorm(x + sublayer(x))``: the
    LayerNorm's output feeds the next residual Add), pre-norm in some (the residual stream bypasses it)."""
    assert synthetic_v4.FIRST_SEED == 3000
    texts = [zoo.get(f"synthetic-{i}").description for i in range(3000, 3030)]
    for kind in ("post-norm", "pre-norm", "gelu,", "gelu-tanh", "relu", "qkv fused", "qkv separate", "no bias"):
        assert sum(kind in t for t in texts) >= 2, kind
    widths = {int(t.split("x")[1].split(",")[0]) for t in texts}
    assert len(widths) >= 8 and min(widths) < 64 and max(widths) >= 512, widths

    def norms(g) -> tuple[int, int]:
        """(LayerNorms that read an Add, LayerNorms whose output an Add reads)"""
        made_by = {o: n.op_type for n in g.nodes for o in n.outputs}
        ln_out = {n.outputs[0] for n in g.nodes if n.op_type == "LayerNormalization"}
        after_add = sum(n.op_type == "LayerNormalization" and made_by.get(n.inputs[0]) == "Add" for n in g.nodes)
        into_add = sum(n.op_type == "Add" and any(i in ln_out for i in n.inputs) for n in g.nodes)
        return after_add, into_add

    post = import_model("synthetic-3001", batch=2)  # post-norm, 2 layers: four Add + LayerNorm
    assert norms(post) == (4, 3)  # the last LayerNorm feeds the head, not a residual
    ref = post.reference()
    assert all(np.isfinite(ref[t]).all() and ref[t].shape[0] == 2 for t in post.output_names)
    assert norms(import_model("synthetic-3000"))[1] == 0  # pre-norm: no residual Add reads a LayerNorm


def test_the_fifth_vocabulary_draws_wide_concatenations_of_summed_branches():
    """Seeds from 4000 on: cells whose nodes (one branch, or the sum of two) meet in a Concat of 3 to 8
    inputs along channels, the shape no earlier vocabulary draws beyond five inputs (nasnet's six-way
    concatenations were the Zen 4's largest leave-one-family-out miss)."""
    assert synthetic_v5.FIRST_SEED == 4000
    texts = [zoo.get(f"synthetic-{i}").description for i in range(4000, 4030)]
    fans = [int(f) for t in texts for f in t.split("concat ")[1].split("-way")[0].split("/")]
    assert min(fans) >= 3 and max(fans) == 8 and sum(f >= 6 for f in fans) >= 15, fans
    assert {int(t.split(", ")[2].split("x")[0]) for t in texts} == {14, 28, 56, 112}
    g = import_model("synthetic-4002", batch=2)  # two cells, each a six-way Concat fed by Adds
    made_by = {o: n.op_type for n in g.nodes for o in n.outputs}
    cats = [n for n in g.nodes if n.op_type == "Concat"]
    assert [len(n.inputs) for n in cats] == [6, 6]
    assert all(sum(made_by.get(i) == "Add" for i in n.inputs) >= 2 for n in cats)
    ref = g.reference()
    assert all(np.isfinite(ref[t]).all() and ref[t].shape[0] == 2 for t in g.output_names)
