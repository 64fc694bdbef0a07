"""Shards and the inductor subsample: pure functions of the candidate key (SHA-256, never Python's ``hash()``)."""

from __future__ import annotations

import hashlib
from typing import Any

#: the share of inductor candidates measured (its compiles take 1-15 s each)
DEFAULT_INDUCTOR_FRACTION = 0.25


def parse_shard(shard: Any) -> tuple[int, int] | None:
    """``"i/n"`` or ``(i, n)`` with ``0 <= i < n`` -> ``(i, n)``; None -> None. ValueError otherwise."""
    if shard is None:
        return None
    text = shard if isinstance(shard, str) else "/".join(map(str, shard)) if isinstance(shard, (tuple, list)) else repr(shard)
    try:
        if isinstance(shard, str):
            a, sep, b = shard.strip().partition("/")
            if not sep:
                raise ValueError
            i, n = int(a), int(b)
        elif isinstance(shard, (tuple, list)) and len(shard) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in shard
        ):
            i, n = shard
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"bad shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(
            f"bad shard {text!r}: the index must be in 0..N-1 and N >= 1 (shards are numbered from 0: 0/2 and 1/2)"
        )
    return (i, n)


def _key_tuple(key: Any) -> tuple[str, str, str]:
    if isinstance(key, tuple):
        return key  # type: ignore[return-value]
    return (key.subgraph_hash, key.backend, key.backend_version)


def _digest(key: Any, salt: str) -> int:
    h, b, v = _key_tuple(key)
    return int.from_bytes(hashlib.sha256(f"{salt}|{h}|{b}|{v}".encode()).digest()[:8], "big")


def shard_of(key: Any, n: int) -> int:
    """The shard (0..n-1) a candidate key belongs to: a SHA-256 of the key, stable across processes and machines."""
    return _digest(key, "collage-ml-shard") % n


def in_shard(key: Any, shard: tuple[int, int] | None) -> bool:
    return shard is None or shard_of(key, shard[1]) == shard[0]


def subsample_keep(key: Any, fraction: float) -> bool:
    """Whether a key is inside a deterministic ``fraction`` subsample (same answer on every run and machine)."""
    if fraction >= 1:
        return True
    if fraction <= 0:
        return False
    return _digest(key, "collage-ml-subsample") / 2**64 < fraction


def _subsampled_backend(name: str) -> bool:
    return name == "inductor" or name.startswith("inductor-")
