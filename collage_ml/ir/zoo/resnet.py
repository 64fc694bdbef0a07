"""ResNet-50 (He et al., 2016), plus the bottleneck stages shared with ResNeXt and 3D-ResNet.

Full size (as in the Collage evaluation): input ``[b, 3, 224, 224]`` ->
stem (7x7/2 conv 64, BN, ReLU, 3x3/2 max pool) -> ``[b, 64, 56, 56]`` ->
4 bottleneck stages of [3, 4, 6, 3] blocks, widths 64/128/256/512, expansion 4,
stride 2 at the first block of stages 2-4 (on the 3x3 conv) ->
``[b, 2048, 7, 7]`` -> global average pool -> flatten -> Linear(2048, 1000) ->
``[b, 1000]``.

Tiny: input ``[b, 3, 32, 32]``; stem with 8 channels; 2 stages of 1 block (widths 8, 16);
Linear(64, 10) -> ``[b, 10]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ._common import Spec


def _conv(dims: int) -> type[nn.Module]:
    return nn.Conv2d if dims == 2 else nn.Conv3d


def _bn(dims: int) -> type[nn.Module]:
    return nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d


def _stride(stride: int, dims: int) -> int | tuple[int, ...]:
    """Spatial stride; for 3-D (T, H, W) the temporal stride stays 1."""
    return stride if dims == 2 else (1, stride, stride)


class Bottleneck(nn.Module):
    """1x1 conv -> BN -> ReLU -> 3x3 (grouped) conv -> BN -> ReLU -> 1x1 conv -> BN, + shortcut, ReLU.

    Maps ``[b, inplanes, *S]`` to ``[b, 4 * planes, *S / stride]`` where ``S`` is
    (H, W) for ``dims=2`` or (T, H, W) for ``dims=3`` (T is never strided). The
    inner width is ``planes * base_width / 64 * groups`` (torchvision's rule, so
    ``groups=32, base_width=4`` gives ResNeXt 32x4d, width ``2 * planes``). The shortcut is a strided
    1x1 conv + BN when the shape changes, else identity.
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, groups: int = 1,
                 base_width: int = 64, dims: int = 2) -> None:
        super().__init__()
        conv, bn = _conv(dims), _bn(dims)
        width = planes * base_width * groups // 64
        out = planes * self.expansion
        self.conv1 = conv(inplanes, width, 1, bias=False)
        self.bn1 = bn(width)
        self.conv2 = conv(width, width, 3, stride=_stride(stride, dims), padding=1,
                          groups=groups, bias=False)
        self.bn2 = bn(width)
        self.conv3 = conv(width, out, 1, bias=False)
        self.bn3 = bn(out)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                conv(inplanes, out, 1, stride=_stride(stride, dims), bias=False), bn(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


def bottleneck_stages(inplanes: int, planes: Sequence[int], blocks: Sequence[int],
                      groups: int = 1, base_width: int = 64, dims: int = 2) -> nn.Sequential:
    """Stages of bottlenecks (ResNet "layer1..layer4"); stage i>0 starts with stride 2.

    ``[b, inplanes, *S]`` -> ``[b, 4 * planes[-1], *S / 2**(len(planes) - 1)]``.
    """
    stages = []
    for i, (p, n) in enumerate(zip(planes, blocks)):
        layers = []
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            layers.append(Bottleneck(inplanes, p, stride, groups, base_width, dims))
            inplanes = p * Bottleneck.expansion
        stages.append(nn.Sequential(*layers))
    return nn.Sequential(*stages)


class ResNet(nn.Module):
    """ResNet classifier: ``[b, 3, H, W]`` -> ``[b, num_classes]``."""

    def __init__(self, stem: int, planes: Sequence[int], blocks: Sequence[int],
                 num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(stem),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.layers = bottleneck_stages(stem, planes, blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(planes[-1] * Bottleneck.expansion, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


FULL = Spec(
    make=lambda: ResNet(64, (64, 128, 256, 512), (3, 4, 6, 3), 1000),
    input_shapes=((3, 224, 224),),
    description="ResNet-50 (stem, 4 bottleneck stages, avgpool, fc-1000); input [1, 3, 224, 224]",
)
TINY = Spec(
    make=lambda: ResNet(8, (8, 16), (1, 1), 10),
    input_shapes=((3, 32, 32),),
    description="tiny ResNet (stem 8, 2 bottleneck stages of 1 block, fc-10); input [1, 3, 32, 32]",
)
