"""BERT encoder (Devlin et al., 2019) over float hidden states, post-LayerNorm.

Full size (as in the Collage evaluation): 8 layers, hidden 256, 8 heads (head dim 32),
sequence 64, FFN 1024, GELU (erf), LayerNorm (eps 1e-12).
Input: hidden states ``[b, 64, 256]`` float32 (no embedding lookup, so every input
is float); output ``[b, 64, 256]``.

Attention is written with explicit MatMul / Mul / Softmax so the exported ONNX
graph shows them (no ``nn.MultiheadAttention``, no ``scaled_dot_product_attention``).

Tiny: 2 layers, hidden 64, 4 heads, sequence 16, FFN 128; input ``[b, 16, 64]``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ._common import Spec


class SelfAttention(nn.Module):
    """Multi-head self-attention: ``[b, s, h]`` -> ``[b, s, h]``."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, s, h]`` -> ``[b, heads, s, head_dim]``."""
        b, s, _ = x.shape
        return x.reshape(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        probs = torch.softmax(scores, dim=-1)  # [b, heads, s, s]
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)
        return self.out(ctx)


class EncoderLayer(nn.Module):
    """x = LN(x + Attn(x)); x = LN(x + W2 GELU(W1 x)). ``[b, s, h]`` -> ``[b, s, h]``."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attention(x))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class BertEncoder(nn.Module):
    """A stack of encoder layers: ``[b, s, hidden]`` -> ``[b, s, hidden]``."""

    def __init__(self, layers: int, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(EncoderLayer(hidden, heads, ffn) for _ in range(layers)))
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """Weights ~ N(0, 1/fan_in) so attention scores have O(1) spread (non-uniform
        softmax); small random biases; LayerNorm gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, m.in_features ** -0.5)
                m.bias.normal_(0.0, 0.02)
            elif isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


FULL = Spec(
    make=lambda: BertEncoder(layers=8, hidden=256, heads=8, ffn=1024),
    input_shapes=((64, 256),),
    description="BERT encoder (8 layers, hidden 256, 8 heads, FFN 1024, GELU); input [1, 64, 256]",
)
TINY = Spec(
    make=lambda: BertEncoder(layers=2, hidden=64, heads=4, ffn=128),
    input_shapes=((16, 64),),
    description="tiny BERT encoder (2 layers, hidden 64, 4 heads, FFN 128); input [1, 16, 64]",
)
