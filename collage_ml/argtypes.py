"""The argparse argument types of the command line (``cli.py``, ``cli_collect.py``), in one place.

Each parser takes the text of one argument and raises ValueError with the message the user
sees; :func:`arg` turns one into an argparse ``type``, so that argparse reports the message as a
usage error (exit status 2).
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable


def arg(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ValueError with a clear message."""

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = fn.__name__
    return parse


def _int_at_least(text: str, low: int, expected: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None
    if v < low:
        raise ValueError(f"expected {expected}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"expected a number >= 0, got {text!r}") from None
    if not v >= 0 or math.isinf(v):
        raise ValueError(f"expected a finite number >= 0, got {text!r}")
    return v


def fraction(text: str) -> float:
    v = nonneg_float(text)
    if v > 1:
        raise ValueError(f"expected a fraction in [0, 1], got {text!r}")
    return v


def shape(text: str) -> tuple[str, list[int]]:
    """``NAME=D1,D2,...`` -> ``(NAME, [D1, D2, ...])``: an input's shape."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, [int(d) for d in dims.split(",")]
    except ValueError:
        raise ValueError(f"expected NAME=D1,D2,... (e.g. input=1,3,224,224), got {text!r}") from None


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, value)``: a model parameter; VALUE is parsed as JSON when it can be (else a string)."""
    import json

    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not key.replace("_", "").isalnum():
        raise ValueError(f"expected KEY=VALUE (e.g. n_estimators=200), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string, e.g. conv=gin
