"""The featurizers' vocabularies and schema version.

Every model artifact stores :data:`SCHEMA_VERSION` and refuses to load under
another one: a change to a vocabulary or to a feature's definition changes the
meaning of the columns a model was trained on. Bump the version whenever
anything in this package changes what a feature means.

History: 1, the first; 2 (2026-12-01), the hardware descriptor gained the ISA
flags and the probe columns (:mod:`~collage_ml.featurize.roofline`), and the
GNN's graph features (``log1p`` counts, edges both ways, the hardware vector)
moved into :mod:`~collage_ml.featurize.graph`, so the featurizer the tests
check is the one the model reads; 3 (2026-12-03), the hardware columns gained
each probe quantity relative to the machine's other probed backends
(``roofline.relative_features``); 4 (2026-12-04), the roofline estimate gives a node that reads only
constants no compute (``roofline.constant_nodes``), as the backends that fold constants do; 5
(2026-12-07), the subgraph columns gained ``n_residual_add_ln`` and ``log_residual_add_ln_bytes``
(``flat.residual_add_ln``): the residual Add + LayerNorm pairs that ONNX Runtime fuses into a kernel of its
own, which decided the backend on such regions on the Zen 3.
"""

from __future__ import annotations

from collage_ml.backends.names import parse_backend_name, switch_value
from collage_ml.errors import CollageError

SCHEMA_VERSION = 5

#: op types with their own histogram column / node one-hot slot; everything else counts as "other"
OPS: tuple[str, ...] = tuple(
    """Conv ConvTranspose MatMul Gemm Einsum
    Relu Clip Sigmoid Tanh Gelu Erf Exp Log Sqrt Pow Neg Abs Reciprocal LeakyRelu HardSigmoid HardSwish Elu Softplus PRelu
    Add Sub Mul Div Max Min Sum Where Equal Less Greater Cast
    Softmax LogSoftmax LayerNormalization BatchNormalization InstanceNormalization GroupNormalization
    ReduceMean ReduceSum ReduceMax GlobalAveragePool GlobalMaxPool AveragePool MaxPool
    Reshape Transpose Concat Split Slice Gather Squeeze Unsqueeze Flatten Expand Pad Tile Resize Identity Shape""".split()
)
OP_INDEX = {op: i for i, op in enumerate(OPS)}
OTHER_OP = len(OPS)  # index of the "other" slot
N_OPS = len(OPS) + 1

#: backend slots (a configured backend such as ``onnxruntime[spin=on]`` uses its base name's slot; what a
#: configuration changes in the graph the backend runs is in ``flat.CONFIG_ZEROES``); unknown backends share
#: the last slot
BACKENDS: tuple[str, ...] = (
    "onnxruntime",
    "openvino",
    "torch",
    "inductor",
    "tvm",
    "torch-cuda",
    "inductor-cuda",
    "onnxruntime-cuda",
    "onnxruntime-tensorrt",
    "tvm-cuda",
)
BACKEND_INDEX = {b: i for i, b in enumerate(BACKENDS)}
OTHER_BACKEND = len(BACKENDS)
N_BACKENDS = len(BACKENDS) + 1


def backend_base(name: str) -> str:
    """``onnxruntime[spin=on]`` -> ``onnxruntime``."""
    return name.split("[", 1)[0]


def backend_options(name: str) -> dict[str, str]:
    """``onnxruntime[skipln=false, opt=Basic]`` -> ``{"skipln": "off", "opt": "basic"}``: the name's options
    (``backends.names.parse_backend_name``), switch values spelled on/off (``names.switch_value``); ``{}`` for a
    plain name, and for a malformed one (the backend registry is what refuses names)."""
    try:
        _, opts = parse_backend_name(name)
    except CollageError:
        return {}
    return {k: switch_value(v) for k, v in opts.items()}


def backend_slot(name: str) -> int:
    return BACKEND_INDEX.get(backend_base(name), OTHER_BACKEND)


class SchemaError(CollageError, ValueError):
    """A model artifact was built with another feature schema."""


def check_schema(found, where: str) -> None:
    if found != SCHEMA_VERSION:
        raise SchemaError(
            f"{where} was built with feature schema {found!r}, but this collage-ml uses schema "
            f"{SCHEMA_VERSION}; retrain it with `collage-ml train` (features changed meaning between versions)"
        )
