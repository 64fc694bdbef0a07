"""Synthetic networks (collage_ml.ir.zoo.synthetic): seeded, varied, importable, and named in collect."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from collage_ml.collector.sources import model_family, resolve_models
from collage_ml.errors import UnknownModelError
from collage_ml.ir import import_model, zoo
from collage_ml.ir.zoo import synthetic


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
