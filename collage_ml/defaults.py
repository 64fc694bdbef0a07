"""Defaults shared by the Python API, the CLI, the tuner and the collector: each is set here, once.

This module sits at the bottom layer (it imports nothing), so every layer can
read it. ``None`` defaults are resolved where they are used, at call time:

- ``BACKENDS = None``: the default CPU set (:func:`collage_ml.backends.default_backends`);
- ``DB = None``: the per-user database, :func:`collage_ml.db.default_db_path`
  (``$COLLAGE_ML_CACHE/measurements.db``, else ``~/.cache/collage-ml/measurements.db``);
- ``THREADS = None``: ``$COLLAGE_ML_THREADS``, else the physical core count
  (:func:`collage_ml.paths.default_threads`), the same for every backend.
"""

#: the largest region candidate enumerated for region backends, in nodes; each backend's whole-model
#: region is always tried on top. The shipped datasets' enumerate runs used 3 (datasets/README.md).
MAX_REGION_SIZE = 3
#: backends: None is the default CPU set
BACKENDS = None
#: the measurement database: None is the per-user one
DB = None
#: intra-op threads for every backend: None is $COLLAGE_ML_THREADS or the physical cores
THREADS = None
#: the placement mode
MODE = "exhaustive"
#: guided placement's cost model, and the artifact ``evaluate`` scores: the shipped one that fits this machine
COST_MODEL = "default"
#: the kind of cost model ``train`` fits
MODEL_KIND = "xgb"
#: ``collect`` calibrates the machine (the probe set) when it starts and again, as a sitting of its own, once
#: the newest calibration is older than this many hours (None: never)
RECALIBRATE_HOURS = 1.0
#: what ``train --pool-probes`` gives one probe table: each machine (fingerprint, threads, protocol), or each
#: instance of it apart (the node its rows recorded: a VM's boot)
POOL_BY = ("machine", "node")
#: how ``train`` and ``eval`` read a candidate that several of their databases measured on one machine (the
#: sittings of a rerun): ``"mean"``, one sample whose label is the geometric mean of its sittings, or ``"each"``,
#: one sample per sitting
SITTINGS = "mean"
SITTINGS_CHOICES = ("mean", "each")
#: progress bars in the Python API (the CLI shows them unless --no-progress)
PROGRESS = False

__all__ = ["BACKENDS", "COST_MODEL", "DB", "MAX_REGION_SIZE", "MODE", "MODEL_KIND", "POOL_BY", "PROGRESS",
           "RECALIBRATE_HOURS", "SITTINGS", "SITTINGS_CHOICES", "THREADS"]
