"""DCGAN generator (Radford et al., 2016).

Full size (as in the Collage evaluation): latent ``[b, 100]`` -> reshape ``[b, 100, 1, 1]``
-> ConvTranspose2d(100, 512, 4, 1, 0) -> ``[b, 512, 4, 4]``, then ConvTranspose2d(k=4, s=2, p=1)
to 256 (8x8), 128 (16x16), 64 (32x32), each followed by BatchNorm + ReLU, then
ConvTranspose2d(64, 3, 4, 2, 1) + Tanh -> ``[b, 3, 64, 64]``.

Tiny: latent ``[b, 16]`` -> 32 (4x4) -> 16 (8x8) -> 3 channels, ``[b, 3, 16, 16]``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ._common import Spec


class Generator(nn.Module):
    """``[b, latent]`` -> ``[b, 3, 4 * 2**len(channels), 4 * 2**len(channels)]``."""

    def __init__(self, latent: int, channels: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = latent
        for i, cout in enumerate(channels):
            stride, pad = (1, 0) if i == 0 else (2, 1)
            layers += [nn.ConvTranspose2d(cin, cout, 4, stride, pad, bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU()]
            cin = cout
        layers += [nn.ConvTranspose2d(cin, 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.reshape(z.shape[0], -1, 1, 1))


FULL = Spec(
    make=lambda: Generator(100, (512, 256, 128, 64)),
    input_shapes=((100,),),
    description="DCGAN generator (ConvTranspose2d 512-256-128-64-3, BN, ReLU, Tanh -> 64x64); input [1, 100]",
)
TINY = Spec(
    make=lambda: Generator(16, (32, 16)),
    input_shapes=((16,),),
    description="tiny DCGAN generator (ConvTranspose2d 32-16-3 -> 16x16); input [1, 16]",
)
