"""NASNet-A cells (Zoph et al., 2018), as in the NasNet-A benchmark of TASO and Collage.

Full size: input ``[b, 64, 56, 56]`` (the output of an ImageNet stem) -> 2 normal cells
(F = 64, 56x56, out 6F = 384 ch) -> 1 reduction cell (F = 128, -> 28x28, out 4F = 512 ch)
-> 2 normal cells (F = 128, out 768 ch) -> ``[b, 768, 28, 28]``.

Each cell takes the two previous outputs (prev, cur), maps both to F channels
(ReLU-1x1 conv-BN; a factorized stride-2 reduction when prev is twice the size of cur)
and combines them with the NASNet-A operations:

* normal cell: sep5(h0) + sep3(h1); sep5(h1) + sep3(h1); avg3(h0) + h1;
  avg3(h1) + avg3(h1); sep3(h0) + h0; output concat [h1, the 5 sums] (6F channels).
* reduction cell (stride 2 on h0/h1): sep5(h0) + sep7(h1) = c0; max3(h0) + sep7(h1) = c1;
  avg3(h0) + sep5(h1) = c2; c1 + avg3(c0) = c3; sep3(c2) + max3(h0) = c4;
  output concat [c1, c2, c3, c4] (4F channels).

``sepK`` is NASNet's "separable_KxK_2": (ReLU, KxK depthwise conv, 1x1 conv, BN) twice.
Average pools exclude padding.

Tiny: input ``[b, 16, 16, 16]``; normal (F = 8) -> reduction (F = 16, 8x8) -> normal
(F = 16) -> ``[b, 96, 8, 8]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ._common import Spec


def relu_conv_bn(cin: int, cout: int) -> nn.Sequential:
    """ReLU -> 1x1 conv -> BN: ``[b, cin, H, W]`` -> ``[b, cout, H, W]``."""
    return nn.Sequential(nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))


class FactorizedReduce(nn.Module):
    """ReLU, then two stride-2 1x1 convs on x and on x shifted by one pixel, concat, BN.

    ``[b, cin, H, W]`` -> ``[b, cout, H / 2, W / 2]``.
    """

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout // 2, 1, stride=2, bias=False)
        self.conv2 = nn.Conv2d(cin, cout - cout // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(x)
        shifted = F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:]
        return self.bn(torch.cat([self.conv1(x), self.conv2(shifted)], dim=1))


class SepConv(nn.Module):
    """NASNet separable conv, applied twice: ``[b, c, H, W]`` -> ``[b, c, H / stride, W / stride]``."""

    def __init__(self, c: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for s in (stride, 1):
            layers += [nn.ReLU(),
                       nn.Conv2d(c, c, kernel, s, kernel // 2, groups=c, bias=False),
                       nn.Conv2d(c, c, 1, bias=False),
                       nn.BatchNorm2d(c)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def avg3(stride: int = 1) -> nn.AvgPool2d:
    return nn.AvgPool2d(3, stride, 1, count_include_pad=False)


def max3(stride: int = 1) -> nn.MaxPool2d:
    return nn.MaxPool2d(3, stride, 1)


class Cell(nn.Module):
    """Common input adjustment: (prev, cur) -> (h0, h1), both ``[b, F, H, W]`` at cur's size."""

    def __init__(self, prev_c: int, cur_c: int, f: int, prev_is_larger: bool) -> None:
        super().__init__()
        self.adjust_prev = FactorizedReduce(prev_c, f) if prev_is_larger else relu_conv_bn(prev_c, f)
        self.adjust_cur = relu_conv_bn(cur_c, f)

    def adjust(self, prev: torch.Tensor, cur: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.adjust_prev(prev), self.adjust_cur(cur)


class NormalCell(Cell):
    """NASNet-A normal cell: -> ``[b, 6F, H, W]``."""

    multiplier = 6

    def __init__(self, prev_c: int, cur_c: int, f: int, prev_is_larger: bool) -> None:
        super().__init__(prev_c, cur_c, f, prev_is_larger)
        self.sep5_h0, self.sep3_h1 = SepConv(f, 5), SepConv(f, 3)
        self.sep5_h1, self.sep3_h1b = SepConv(f, 5), SepConv(f, 3)
        self.sep3_h0 = SepConv(f, 3)
        self.avg = avg3()

    def forward(self, prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        h0, h1 = self.adjust(prev, cur)
        c0 = self.sep5_h0(h0) + self.sep3_h1(h1)
        c1 = self.sep5_h1(h1) + self.sep3_h1b(h1)
        c2 = self.avg(h0) + h1
        c3 = self.avg(h1) + self.avg(h1)
        c4 = self.sep3_h0(h0) + h0
        return torch.cat([h1, c0, c1, c2, c3, c4], dim=1)


class ReductionCell(Cell):
    """NASNet-A reduction cell: -> ``[b, 4F, H / 2, W / 2]``."""

    multiplier = 4

    def __init__(self, prev_c: int, cur_c: int, f: int, prev_is_larger: bool) -> None:
        super().__init__(prev_c, cur_c, f, prev_is_larger)
        self.sep5_h0, self.sep7_h1 = SepConv(f, 5, 2), SepConv(f, 7, 2)
        self.sep7_h1b, self.sep5_h1 = SepConv(f, 7, 2), SepConv(f, 5, 2)
        self.sep3_c2 = SepConv(f, 3)
        self.max_s2, self.avg_s2, self.avg_s1 = max3(2), avg3(2), avg3(1)

    def forward(self, prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        h0, h1 = self.adjust(prev, cur)
        c0 = self.sep5_h0(h0) + self.sep7_h1(h1)
        c1 = self.max_s2(h0) + self.sep7_h1b(h1)
        c2 = self.avg_s2(h0) + self.sep5_h1(h1)
        c3 = c1 + self.avg_s1(c0)
        c4 = self.sep3_c2(c2) + self.max_s2(h0)
        return torch.cat([c1, c2, c3, c4], dim=1)


class NasNetA(nn.Module):
    """A chain of cells, each fed the two previous outputs; ``plan`` is a list of
    ("normal" | "reduction", F). ``[b, in_c, H, W]`` -> ``[b, mult * F_last, H', W']``."""

    def __init__(self, in_c: int, plan: Sequence[tuple[str, int]]) -> None:
        super().__init__()
        cells = []
        prev_c = cur_c = in_c
        prev_larger = False  # is prev spatially 2x cur?
        for kind, f in plan:
            cls = NormalCell if kind == "normal" else ReductionCell
            cells.append(cls(prev_c, cur_c, f, prev_larger))
            prev_c, cur_c = cur_c, cls.multiplier * f
            prev_larger = cls is ReductionCell
        self.cells = nn.ModuleList(cells)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prev = cur = x
        for cell in self.cells:
            prev, cur = cur, cell(prev, cur)
        return cur


FULL = Spec(
    make=lambda: NasNetA(64, [("normal", 64), ("normal", 64), ("reduction", 128),
                              ("normal", 128), ("normal", 128)]),
    input_shapes=((64, 56, 56),),
    description="NASNet-A cells (4 normal + 1 reduction; sep convs 3/5/7, avg/max pools); input [1, 64, 56, 56]",
)
TINY = Spec(
    make=lambda: NasNetA(16, [("normal", 8), ("reduction", 16), ("normal", 16)]),
    input_shapes=((16, 16, 16),),
    description="tiny NASNet-A cells (normal, reduction, normal; F 8/16); input [1, 16, 16, 16]",
)
