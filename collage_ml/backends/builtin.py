"""Registers the built-in backends. Each module registers itself on import and
imports its optional package lazily, so this never fails for a missing package."""

from collage_ml.backends import onnxruntime_backend  # noqa: F401
from collage_ml.backends import openvino_backend  # noqa: F401
from collage_ml.backends import torch_backend  # noqa: F401
from collage_ml.backends import inductor_backend  # noqa: F401
from collage_ml.backends import tvm_backend  # noqa: F401
from collage_ml.backends import mnn_backend  # noqa: F401
from collage_ml.backends import tinygrad_backend  # noqa: F401
from collage_ml.backends import cuda  # noqa: F401  (registers CUDA variants only when a GPU is present)
