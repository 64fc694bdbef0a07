"""Featurizers: candidates (or stored subgraphs) to model inputs.

- :mod:`~collage_ml.featurize.flat`: fixed-length rows for XGBoost;
- :mod:`~collage_ml.featurize.graph`: ``torch_geometric`` graphs for the GNN;
- :mod:`~collage_ml.featurize.info`: the per-subgraph analysis both read,
  from a live subgraph or from the ONNX bytes the database stores;
- :mod:`~collage_ml.featurize.schema`: vocabularies and :data:`SCHEMA_VERSION`.
"""

from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.info import SubgraphInfo, info_from_onnx, subgraph_from_onnx, subgraph_info
from collage_ml.featurize.schema import SCHEMA_VERSION, SchemaError, check_schema

__all__ = [
    "HardwareDesc",
    "SCHEMA_VERSION",
    "SchemaError",
    "SubgraphInfo",
    "check_schema",
    "info_from_onnx",
    "subgraph_from_onnx",
    "subgraph_info",
]
