"""collage-ml: Collage-style multi-backend placement with a learned cost model.

The public API lives in :mod:`collage_ml.api` and is re-exported here lazily,
so ``import collage_ml.db`` (e.g. in a measurement worker) stays cheap.
"""

__version__ = "0.1.0"

_API = ("place", "load", "collect", "train", "evaluate", "show", "calibrate", "export_zoo", "import_model", "inspect_model")


def __getattr__(name):
    if name in _API:
        from collage_ml import api

        return getattr(api, name)
    if name == "CollageError":
        from collage_ml.errors import CollageError

        return CollageError
    raise AttributeError(f"module 'collage_ml' has no attribute {name!r}")


__all__ = ["CollageError", *_API, "__version__"]
