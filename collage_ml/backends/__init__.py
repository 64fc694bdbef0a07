"""Backends: the registry, the pattern language and one module per backend."""

from collage_ml.backends.base import (
    Backend,
    Executable,
    all_backends,
    default_backends,
    get_backend,
    register_backend,
    registered,
    resolve_backends,
    to_numpy,
)
from collage_ml.backends.patterns import OpPattern, RegionPattern, step

__all__ = [
    "Backend", "Executable", "OpPattern", "RegionPattern", "all_backends", "default_backends",
    "get_backend", "register_backend", "registered", "resolve_backends", "step", "to_numpy",
]
