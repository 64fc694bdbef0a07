"""The graph IR: :class:`Graph`, :class:`SubGraph`, model import and the model zoo."""

from collage_ml.ir.graph import Graph, Node, SubGraph, TensorInfo
from collage_ml.ir.importers import from_onnx, import_model, load_onnx_file

__all__ = ["Graph", "Node", "SubGraph", "TensorInfo", "from_onnx", "import_model", "load_onnx_file"]
