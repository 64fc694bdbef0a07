"""MobileNetV2 (Sandler et al., 2018).

Full size (as in the Collage evaluation): input ``[b, 3, 224, 224]`` -> 3x3/2 conv 32,
BN, ReLU6 -> inverted residual blocks (t, c, n, s) = (1,16,1,1) (6,24,2,2) (6,32,3,2)
(6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1), each: 1x1 expand conv + BN + ReLU6
(skipped when t=1), 3x3 depthwise conv + BN + ReLU6, 1x1 linear projection + BN, residual
add when stride 1 and channels match -> 1x1 conv 1280, BN, ReLU6 -> ``[b, 1280, 7, 7]``
-> global average pool -> Linear(1280, 1000) -> ``[b, 1000]`` (dropout omitted: eval mode).

Tiny: input ``[b, 3, 32, 32]``; stem 8; blocks (1,8,1,1) (6,16,2,2); last conv 64;
Linear(64, 10) -> ``[b, 10]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ._common import Spec

FULL_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                 (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
            relu6: bool = True) -> nn.Sequential:
    """Conv2d (same padding, no bias) -> BN [-> ReLU6]."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if relu6:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> project (1x1, linear) [+ x].

    ``[b, cin, H, W]`` -> ``[b, cout, H / stride, W / stride]``.
    """

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn(cin, hidden, 1)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden),
                   conv_bn(hidden, cout, 1, relu6=False)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """``[b, 3, H, W]`` -> ``[b, num_classes]``."""

    def __init__(self, stem: int, settings: Sequence[tuple[int, int, int, int]],
                 last: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, stem, 3, 2)]
        cin = stem
        for t, c, n, s in settings:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


FULL = Spec(
    make=lambda: MobileNetV2(32, FULL_SETTINGS, 1280, 1000),
    input_shapes=((3, 224, 224),),
    description="MobileNetV2 (inverted residuals, depthwise convs, ReLU6, fc-1000); input [1, 3, 224, 224]",
)
TINY = Spec(
    make=lambda: MobileNetV2(8, ((1, 8, 1, 1), (6, 16, 2, 2)), 64, 10),
    input_shapes=((3, 32, 32),),
    description="tiny MobileNetV2 (3 inverted residuals, depthwise convs, ReLU6, fc-10); input [1, 3, 32, 32]",
)
