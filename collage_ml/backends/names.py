"""Configured backend names: ``base[key=value,...]``, parsed, checked against a grid, and spelled canonically.

A backend with configurations declares its grid (``Backend.CONFIGS``: key ->
allowed values, the first the default). :func:`parse_backend_name` splits a
name, :func:`normalise_options` checks and canonicalises its options against
the grid, :func:`configured_name` spells a configuration canonically (only the
keys that differ from the defaults, sorted), and :func:`split_backend_names`
splits a comma-separated list at top-level commas. :mod:`.base` re-exports all
of them; this module imports only :mod:`collage_ml.errors`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from collage_ml.errors import BackendError

_TRUE = ("on", "true", "1", "yes")
_FALSE = ("off", "false", "0", "no")


def parse_backend_name(name: str) -> tuple[str, dict[str, str]]:
    """``"onnxruntime[spin=on, opt=basic]"`` -> ``("onnxruntime", {"spin": "on", "opt": "basic"})``.

    Values are returned as written (stripped); :func:`normalise_options` validates them.
    """
    text = name.strip()
    if "[" not in text and "]" not in text:
        if not text:
            raise BackendError("empty backend name")
        return text, {}
    base, sep, rest = text.partition("[")
    base = base.strip()
    if not base or not sep or not rest.endswith("]") or "[" in rest or "]" in rest[:-1]:
        raise BackendError(f"malformed backend name {name!r}; expected base[key=value,...], e.g. onnxruntime[spin=on]")
    options: dict[str, str] = {}
    body = rest[:-1].strip()
    for item in body.split(",") if body else []:
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq or not key or not value:
            raise BackendError(f"malformed option {item.strip()!r} in backend name {name!r}; expected key=value")
        if key in options:
            raise BackendError(f"option {key!r} given twice in backend name {name!r}")
        options[key] = value
    return base, options


def switch_value(value: object) -> str:
    """A switch's value spelled canonically: true/1/yes are ``on``, false/0/no are ``off``; anything else
    lower-cased as written."""
    if isinstance(value, bool):
        return "on" if value else "off"
    v = str(value).strip().lower()
    return "on" if v in _TRUE else "off" if v in _FALSE else v


def _normalise_value(value: object, allowed: Sequence[str]) -> str:
    if isinstance(value, bool) or set(allowed) <= {"on", "off"}:  # a switch
        return switch_value(value)
    v = str(value).strip().lower()
    try:
        return str(int(v))  # 02 -> 2
    except ValueError:
        return v


def normalise_options(base: str, grid: Mapping[str, Sequence[str]], options: Mapping[str, object]) -> dict[str, str]:
    """Canonical values for ``options`` (booleans as on/off, numbers without padding), checked against ``grid``.

    Raises BackendError naming the declared grid for an unknown key or value.
    """
    out = {}
    for key, value in options.items():
        k = str(key).strip().lower()
        if k not in grid:
            raise BackendError(f"{base} has no option {k!r}; its declared grid is {grid_text(base, grid)}")
        v = _normalise_value(value, grid[k])
        if v not in grid[k]:
            raise BackendError(f"{base}: {k}={value} is not in the declared grid {grid_text(base, grid)}")
        out[k] = v
    return out


def grid_text(base: str, grid: Mapping[str, Sequence[str]]) -> str:
    """``onnxruntime[opt=all|basic, spin=off|on]`` (defaults first)."""
    return f"{base}[" + ", ".join(f"{k}={'|'.join(v)}" for k, v in sorted(grid.items())) + "]"


def configured_name(base: str, grid: Mapping[str, Sequence[str]], options: Mapping[str, str]) -> str:
    """The canonical name: ``base`` plus the options that differ from the grid's defaults, keys sorted."""
    diff = {k: v for k, v in options.items() if not (k in grid and grid[k] and grid[k][0] == v)}
    if not diff:
        return base
    return f"{base}[" + ",".join(f"{k}={diff[k]}" for k in sorted(diff)) + "]"


def split_backend_names(names: str) -> list[str]:
    """Splits a comma-separated list at top-level commas only (not inside ``[...]``)."""
    out, depth, cur = [], 0, []
    for ch in names:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise BackendError(f"unbalanced ']' in backend list {names!r}")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise BackendError(f"unbalanced '[' in backend list {names!r}")
    out.append("".join(cur))
    return [n.strip() for n in out if n.strip()]
