"""Where collage-ml keeps its files and how many threads it uses: the machine-level settings.

Both are read from the environment at call time (never at import), so a test
or a worker process that sets the variable sees it. This module sits at the
bottom layer and imports nothing from collage-ml, so every layer can use it.

- :func:`cache_dir`: ``$COLLAGE_ML_CACHE``, else ``~/.cache/collage-ml``. It holds the
  exported zoo models, the measurement database, TVM's tuning records and Inductor's cache.
- :func:`default_threads`: ``$COLLAGE_ML_THREADS``, else the physical core count; the intra-op
  thread count of every backend, the same for all of them.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """collage-ml's cache folder (``$COLLAGE_ML_CACHE`` or ``~/.cache/collage-ml``)."""
    return Path(os.environ.get("COLLAGE_ML_CACHE", Path.home() / ".cache" / "collage-ml"))


def default_threads() -> int:
    """Intra-op threads for every backend: ``$COLLAGE_ML_THREADS``, else the physical core count."""
    env = os.environ.get("COLLAGE_ML_THREADS")
    if env:
        return max(1, int(env))
    try:
        import psutil

        return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except ImportError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


__all__ = ["cache_dir", "default_threads"]
