"""The second vocabulary of synthetic image networks (seeds from :data:`FIRST_SEED` on).

The first vocabulary (:mod:`.synthetic`, seeds below 1000) is frozen: datasets name its networks by seed. So
is this one, since ``datasets/cpu-2core-xeon-amx-synth-v2-m5``: a new block kind belongs in a third vocabulary
at a new seed range, not here.
Diagnosed on the Intel Xeon's leave-one-family-out folds (README, "Cost models"), the lone nodes a model
priced worst were block kinds that vocabulary draws rarely or never: depthwise convolutions of 5x5 and 7x7,
and strided ones; grouped convolutions of many groups (4 to 32 channels per group); transposed convolutions
of stride 1 or with odd kernels; explicit padding and cropping; pooling of stride 1 inside multi-branch cells;
channel counts and feature maps that are not powers of two. This vocabulary draws each of those at random
shapes, from the common building blocks of CNNs (separable convolutions, inverted residuals, grouped
bottlenecks, multi-branch cells, upsampling stages), not from any zoo model's layer list.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import Head, Residual as _Residual, Sum as _Sum, drawn_width

FIRST_SEED = 1000


def _act(rng) -> nn.Module:
    return (nn.ReLU, nn.ReLU6, nn.SiLU, nn.Hardswish, nn.GELU, nn.LeakyReLU)[int(rng.integers(6))]()


def _width(rng, lo: int, hi: int) -> int:
    """A channel count anywhere in [lo, hi], a multiple of 1, 4, 8 or 16."""
    return drawn_width(rng, lo, hi, (1, 4, 8, 8, 16))


def _cbr(rng, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act:
        layers.append(_act(rng))
    return nn.Sequential(*layers)


class _Cat(nn.Module):
    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        return torch.cat([b(x) for b in self.branches], dim=1)


class _Crop(nn.Module):
    """Drops the first row and column: the slice that undoes an asymmetric pad."""

    def forward(self, x):
        return x[:, :, 1:, 1:]


def _separable(rng, c: int, cout: int, k: int, stride: int) -> nn.Sequential:
    """act -> depthwise k x k (stride 1 or 2) -> pointwise -> BatchNorm."""
    return nn.Sequential(_act(rng), nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False),
                         nn.Conv2d(c, cout, 1, bias=False), nn.BatchNorm2d(cout))


def image(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    c = int(rng.choice([3, 3, 16, 24, 32, 48]))
    hw = int(rng.integers(12, 113))
    shape = (c, hw, hw)
    layers: list[nn.Module] = []
    if c == 3:  # a stem, so that the blocks below see real channel counts
        cout = _width(rng, 16, 64)
        layers.append(_cbr(rng, 3, cout, int(rng.choice([3, 5, 7])), 2 if hw >= 32 else 1))
        c, hw = cout, (hw - 1) // 2 + 1 if hw >= 32 else hw
    for _ in range(int(rng.integers(4, 10))):
        kind = rng.choice(["sep", "inverted", "grouped", "cell", "tconv", "pad", "conv"])
        down = 2 if hw >= 10 and rng.random() < 0.3 else 1
        if kind == "sep":
            k, cout = int(rng.choice([3, 5, 7])), _width(rng, 8, 512)
            layers.append(_separable(rng, c, cout, k, down))
            c, hw = cout, (hw - 1) // down + 1
        elif kind == "inverted":
            hidden, k = c * int(rng.choice([2, 3, 4, 6])), int(rng.choice([3, 5, 7]))
            body = nn.Sequential(_cbr(rng, c, hidden, 1), _cbr(rng, hidden, hidden, k, down, groups=hidden),
                                 _cbr(rng, hidden, c if down == 1 else _width(rng, 8, 320), 1, act=False))
            cout = body[-1][0].out_channels
            layers.append(_Residual(body) if down == 1 and cout == c else body)
            c, hw = cout, (hw - 1) // down + 1
        elif kind == "grouped":
            per_group = int(rng.choice([4, 8, 16, 32]))
            width = per_group * int(rng.integers(2, 33))
            body = nn.Sequential(_cbr(rng, c, width, 1), _cbr(rng, width, width, 3, 1, groups=width // per_group),
                                 _cbr(rng, width, c, 1, act=False))
            layers += [_Residual(body), nn.ReLU()]
        elif kind == "cell":
            pools = [nn.AvgPool2d(3, 1, 1, count_include_pad=False), nn.MaxPool2d(3, 1, 1), nn.Identity()]
            options = [lambda: _separable(rng, c, c, int(rng.choice([3, 5, 7])), 1),
                       lambda: pools[int(rng.integers(3))]]
            branches = [options[int(rng.integers(2))]() for _ in range(int(rng.integers(2, 5)))]
            if rng.random() < 0.5:
                layers.append(_Sum(*branches))
            else:
                layers.append(_Cat(*branches))
                c = c * len(branches)
                layers.append(_cbr(rng, c, _width(rng, 8, 512), 1))  # squeeze the concatenation back
                c = layers[-1][0].out_channels
        elif kind == "tconv" and hw <= 64:
            k, stride = int(rng.choice([2, 3, 4, 5])), int(rng.choice([1, 2]))
            pad = max(0, (k - stride + 1) // 2)
            cout = _width(rng, 8, 384)
            t = nn.ConvTranspose2d(c, cout, k, stride, pad, bias=False)
            layers += [t, nn.BatchNorm2d(cout), _act(rng)]
            c, hw = cout, (hw - 1) * stride - 2 * pad + k
        elif kind == "pad" and hw >= 8:
            cout = _width(rng, 8, 512)
            layers += [nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(c, cout, 3, 2, 0, bias=False), nn.BatchNorm2d(cout)]
            c, hw = cout, (hw + 1 - 3) // 2 + 1
            if rng.random() < 0.5 and hw >= 4:
                layers += [nn.ZeroPad2d((1, 0, 1, 0)), _Crop()]
        else:
            k, cout = int(rng.choice([1, 1, 3, 3, 5])), _width(rng, 8, 640)
            layers.append(_cbr(rng, c, cout, k, down))
            c, hw = cout, (hw + 2 * (k // 2) - k) // down + 1
    layers.append(Head(c, 2))
    return nn.Sequential(*layers), shape, f"image {shape[0]}x{shape[1]}x{shape[2]}, {len(layers)} blocks (v2)"
