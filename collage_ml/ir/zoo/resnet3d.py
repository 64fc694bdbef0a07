"""3D-ResNet-50 (Hara et al., 2018), bottleneck stages only (no stem, no head).

Full size (as in the Collage evaluation): input ``[b, 64, 3, 56, 56]`` (N, C, T, H, W)
-> 4 stages of [3, 4, 6, 3] Conv3d bottlenecks (1x1x1, 3x3x3, 1x1x1; widths
64/128/256/512, expansion 4), BatchNorm3d, ReLU, 1x1x1 conv downsample shortcuts.
Stride 2 in H and W (temporal stride 1) at the start of stages 2-4 ->
``[b, 2048, 3, 7, 7]``.

Tiny: input ``[b, 16, 2, 16, 16]``; 2 stages of 1 block (widths 8, 16) -> ``[b, 64, 2, 8, 8]``.
"""

from __future__ import annotations

from ._common import Spec
from .resnet import bottleneck_stages

FULL = Spec(
    make=lambda: bottleneck_stages(64, (64, 128, 256, 512), (3, 4, 6, 3), dims=3),
    input_shapes=((64, 3, 56, 56),),
    description="3D-ResNet-50, stages 1-4 (Conv3d bottlenecks); input [1, 64, 3, 56, 56]",
)
TINY = Spec(
    make=lambda: bottleneck_stages(16, (8, 16), (1, 1), dims=3),
    input_shapes=((16, 2, 16, 16),),
    description="tiny 3D-ResNet (2 Conv3d bottleneck stages of 1 block); input [1, 16, 2, 16, 16]",
)
