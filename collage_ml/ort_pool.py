"""ONNX Runtime's process-wide thread pool: whether this process made it, and what a session must do then.

ONNX Runtime's global intra-op pool is made once per process
(``onnxruntime.set_global_thread_pool_sizes``); once it exists, onnxruntime
refuses every new session that asks for a pool of its own. The state is
process state, not a backend's: the ``onnxruntime[pool=shared]`` backend makes
the pool (:func:`ensure_global_pool`), and every other code that makes ORT
sessions (the reference run in :mod:`collage_ml.ir.reference`, the importer's
shape and constant checks, the backend's op probes) passes its options
through :func:`fit_session_options`. The rules are in
:mod:`collage_ml.backends.onnxruntime_backend`'s docstring.

This module sits at the bottom layer: it imports only :mod:`collage_ml.errors`,
and onnxruntime inside the one function that needs it.
"""

from __future__ import annotations

import threading
from typing import Any

from collage_ml.errors import BackendError, first_line

#: threads of this process's ONNX Runtime global pool once a ``pool=shared`` session created it, else None
_GLOBAL_POOL: dict[str, int | None] = {"threads": None}
_GLOBAL_POOL_LOCK = threading.Lock()


def global_pool_threads() -> int | None:
    """The intra-op size of the global pool this process made for ``pool=shared`` sessions, or None."""
    return _GLOBAL_POOL["threads"]


def fit_session_options(so) -> Any:
    """Makes ``so`` (an ``onnxruntime.SessionOptions``) acceptable in this process: once the global pool
    exists, a session must use it. For code outside the backend that makes sessions (reference runs)."""
    if _GLOBAL_POOL["threads"] is not None:
        so.use_per_session_threads = False
    return so


def ensure_global_pool(threads: int) -> None:
    """Creates the process's global ORT pool with ``threads`` intra-op threads, once; checks the size after."""
    import onnxruntime as ort

    with _GLOBAL_POOL_LOCK:
        have = _GLOBAL_POOL["threads"]
        if have is None:
            try:
                # inter-op: 1 (sessions run sequentially, so the inter-op pool is never used)
                ort.set_global_thread_pool_sizes(int(threads), 1)
            except Exception as e:  # created by someone else in this process: size unknown
                raise BackendError(
                    f"onnxruntime's global thread pool was already created outside collage-ml ({first_line(e)}); "
                    "pool=shared needs collage-ml to create it"
                ) from None
            _GLOBAL_POOL["threads"] = int(threads)
        elif have != int(threads):
            raise BackendError(
                f"this process's shared onnxruntime pool has {have} threads; a pool=shared session cannot use "
                f"{threads} (the global pool is created once per process)"
            )


__all__ = ["ensure_global_pool", "fit_session_options", "global_pool_threads"]
