"""Backend configurations worth measuring: configurations are backends.

A backend is an implementation plus a configuration, named
``base[key=value,...]`` (:func:`collage_ml.backends.base.parse_backend_name`).
Each backend class declares its grid in ``CONFIGS``; the all-defaults
configuration keeps the plain name (``onnxruntime`` is
``onnxruntime[opt=all,pool=own,skipln=on,spin=off]``), so its measurements stay valid.
A configured name and its version go into the measurement key, so each
configuration has its own rows.

:data:`NAMED` is the short list worth measuring on a small CPU (2 cores):
the knobs that moved whole-model latency there (spinning, graph
optimisation/layout, the residual Add + LayerNorm fusion, OpenVINO streams and
pinning). ``openvino[hint=throughput]``
is in the grid but not in the list: with one stream (the default) it changes
nothing, and with ``streams=auto`` it picks 2 streams on 2 cores, which is
``openvino[streams=2]``.

:data:`PLAN_ONLY` holds configurations that only make sense for a whole placed
model: ``onnxruntime[pool=shared,spin=on]`` makes every ORT session of the
process share one global pool. Measured alone a subgraph on it behaves like
``onnxruntime[spin=on]``, and it changes process-wide state that ``pool=own``
sessions cannot live with (see :mod:`collage_ml.backends.onnxruntime_backend`),
so it is not measured per subgraph by default.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from collage_ml.backends.base import Backend, get_backend, grid_text, registered, split_backend_names
from collage_ml.errors import BackendError

#: configurations worth measuring per subgraph, per base backend (the plain backend first)
NAMED: dict[str, tuple[str, ...]] = {
    "onnxruntime": (
        "onnxruntime",
        "onnxruntime[spin=on]",  # workers spin before sleeping: faster back-to-back calls, costs idle CPU
        "onnxruntime[opt=extended]",  # no NCHWc layout transform (convolutions stay NCHW)
        "onnxruntime[opt=basic]",  # no fusions (Conv+Relu, Gelu, LayerNorm, attention ...)
        "onnxruntime[skipln=off]",  # every fusion but Add + LayerNorm -> SkipLayerNormalization (slow on the Zen 3)
    ),
    "openvino": (
        "openvino",
        "openvino[streams=2]",  # a single request gets half the threads, less synchronisation
        "openvino[pin=off]",  # threads not pinned to cores
    ),
}

#: configurations for whole placed models only (not measured per subgraph by default)
PLAN_ONLY: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("onnxruntime[pool=shared,spin=on]",),
}


def configured_names(base_names: Iterable[str] | str | None = None, plan_only: bool = False) -> list[str]:
    """The named configurations of ``base_names`` (default: every base with a list), canonical names."""
    bases = _bases(base_names)
    out = []
    for base in bases:
        names = list(NAMED.get(base, (base,)))
        if plan_only:
            names += PLAN_ONLY.get(base, ())
        for n in names:
            name = get_backend(n).name
            if name not in out:
                out.append(name)
    return out


def configured_backends(base_names: Iterable[str] | str | None = None, plan_only: bool = False) -> list[Backend]:
    """The named configurations of ``base_names`` as backends, the available ones only.

    ``base_names``: a list or comma-separated string of base backends (default: every base
    backend with a named list, i.e. onnxruntime and openvino); a base without a list gives just
    its plain backend. ``plan_only`` adds :data:`PLAN_ONLY` (e.g. the shared ORT pool).
    """
    out = []
    for n in configured_names(base_names, plan_only):
        b = get_backend(n)
        if b.available():
            out.append(b)
    return out


def grids(base_names: Iterable[str] | str | None = None) -> dict[str, str]:
    """Each base backend's declared grid as text, e.g. ``{"openvino": "openvino[hint=latency|throughput, ...]"}``."""
    out = {}
    for base in _bases(base_names, default=registered()):
        cls_grid = type(get_backend(base)).CONFIGS
        if cls_grid:
            out[base] = grid_text(base, cls_grid)
    return out


def _bases(base_names: Iterable[str] | str | None, default: Sequence[str] | None = None) -> list[str]:
    if base_names is None:
        return list(default if default is not None else NAMED)
    names = split_backend_names(base_names) if isinstance(base_names, str) else list(base_names)
    for n in names:
        if "[" in n:
            raise BackendError(f"{n!r}: give base backend names (e.g. onnxruntime), not configurations")
        get_backend(n)  # unknown names raise with suggestions
    return names
