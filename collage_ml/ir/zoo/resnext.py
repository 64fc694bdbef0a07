"""ResNeXt-50 32x4d (Xie et al., 2017), bottleneck stages only (no stem, no head).

Full size (as in the Collage evaluation): input ``[b, 64, 56, 56]`` (the output of
a ResNet stem) -> 4 stages of [3, 4, 6, 3] bottlenecks with 32 groups of width 4
(inner widths 128/256/512/1024, outputs 256/512/1024/2048), grouped 3x3 convs
(groups=32), BN, ReLU, strided 1x1 conv downsample shortcuts -> ``[b, 2048, 7, 7]``.

Tiny: input ``[b, 16, 16, 16]``; 2 stages of 1 block, 4 groups (base width 16, so
inner widths 8/16, i.e. 2/4 channels per group) -> ``[b, 64, 8, 8]``.
"""

from __future__ import annotations

from ._common import Spec
from .resnet import bottleneck_stages

FULL = Spec(
    make=lambda: bottleneck_stages(64, (64, 128, 256, 512), (3, 4, 6, 3), groups=32, base_width=4),
    input_shapes=((64, 56, 56),),
    description="ResNeXt-50 32x4d, stages 1-4 (grouped 3x3 convs, groups=32); input [1, 64, 56, 56]",
)
TINY = Spec(
    make=lambda: bottleneck_stages(16, (8, 16), (1, 1), groups=4, base_width=16),
    input_shapes=((16, 16, 16),),
    description="tiny ResNeXt (2 stages of 1 block, groups=4); input [1, 16, 16, 16]",
)
