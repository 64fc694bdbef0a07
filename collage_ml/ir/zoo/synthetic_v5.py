"""The fifth vocabulary of synthetic networks (seeds from :data:`FIRST_SEED` on): cells whose branches meet in
wide concatenations.

On the Zen 4, leave-one-family-out held 40% of its misses in nasnet, and there the ``Add`` + six-way
``Concat`` regions over 56x56 maps were predicted 30% too fast: no other family and no synthetic set held a
``Concat`` of more than five inputs (docs/results/cost-models.md, "The Zen 4 with four synthetic sets and two
sittings"). Wide concatenations of large maps are common outside nasnet too (Inception, DenseNet and
searched cells), and they are memory-bound copies whose cost a backend pays differently.

This vocabulary draws image networks of 1 to 3 cells. A cell runs 3 to 8 *nodes* on its input, each the sum
of two branches or one branch alone (branches: identity, 1x1 or 3x3 convolution, separable 3x3 or 5x5
convolution, 3x3 average or max pooling of stride 1), then concatenates 3 to 8 tensors along channels (its
nodes, and in some cells the cell's input), and a 1x1 convolution brings the width back; between cells a
strided pooling may halve the map. Widths 8 to 96 and maps 14 to 112 (tensors up to about 200 thousand
elements a map), drawn, not nasnet's. Frozen once a dataset names its seeds; a new block kind belongs in a
sixth vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import Head, Sum, drawn_width

FIRST_SEED = 4000

#: channels x height x width of a cell's input at most this
MAX_MAP = 200_000

_BRANCHES = ("identity", "conv1", "conv3", "sep3", "sep5", "avg3", "max3")


def _branch(rng, kind: str, c: int) -> nn.Module:
    if kind == "identity":
        return nn.Identity()
    if kind in ("avg3", "max3"):
        return (nn.AvgPool2d if kind == "avg3" else nn.MaxPool2d)(3, 1, 1)
    if kind in ("conv1", "conv3"):
        k = 1 if kind == "conv1" else 3
        return nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, k, 1, k // 2, bias=False), nn.BatchNorm2d(c))
    k = 3 if kind == "sep3" else 5
    return nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, k, 1, k // 2, groups=c, bias=False),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))


class _Cell(nn.Module):
    """``project(concat([nodes(x)..., x?]))``: the nodes' outputs, and the input where ``keep_input``, joined
    along channels, then a 1x1 convolution to ``cout`` channels."""

    def __init__(self, nodes: list[nn.Module], keep_input: bool, c: int, cout: int):
        super().__init__()
        self.nodes, self.keep_input = nn.ModuleList(nodes), keep_input
        width = c * (len(nodes) + int(keep_input))
        self.project = nn.Sequential(nn.ReLU(), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        parts = [n(x) for n in self.nodes] + ([x] if self.keep_input else [])
        return self.project(torch.cat(parts, dim=1))


def cells(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    """A network of concatenating cells drawn from ``rng``: (module, input shape without the batch,
    description)."""
    hw = int(rng.choice([14, 28, 56, 112]))
    c = drawn_width(rng, 8, 96, (4, 8, 8, 16))
    while c > 8 and c * hw * hw > MAX_MAP:
        c = max(8, c // 2)
    hw0, c0 = hw, c
    layers: list[nn.Module] = [nn.Conv2d(3, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)]
    fans: list[int] = []
    for i in range(int(rng.integers(1, 4))):
        n = int(rng.integers(3, 9))
        keep = bool(rng.random() < 0.3) and n < 8
        nodes = []
        for _ in range(n):
            kinds = rng.choice(_BRANCHES, size=2 if rng.random() < 0.7 else 1)
            nodes.append(Sum(*(_branch(rng, str(k), c) for k in kinds)))  # one branch, or the sum of two
        cout = drawn_width(rng, 8, 96, (4, 8, 8, 16))
        layers.append(_Cell(nodes, keep, c, cout))
        fans.append(n + int(keep))
        c = cout
        if i < 2 and hw >= 28 and rng.random() < 0.4:
            layers.append((nn.AvgPool2d if rng.random() < 0.5 else nn.MaxPool2d)(2, 2))
            hw //= 2
    layers.append(Head(c, 2))
    what = f"cells {len(fans)}, concat {'/'.join(map(str, fans))}-way, {hw0}x{hw0}, width {c0}"
    return nn.Sequential(*layers), (3, hw0, hw0), what
