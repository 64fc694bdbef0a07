"""Learned cost models: :class:`CostModel` (base), ``xgb`` and ``gnn``, and their training data."""

from collage_ml.models.base import (
    ArtifactError,
    CostModel,
    create_model,
    default_artifact,
    load_model,
    read_meta,
)
from collage_ml.models.dataset import Dataset, Sample

__all__ = [
    "ArtifactError",
    "CostModel",
    "Dataset",
    "Sample",
    "create_model",
    "default_artifact",
    "load_model",
    "read_meta",
]
