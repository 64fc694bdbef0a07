"""The ``tvm`` backend's Relax pipeline: ONNX region -> Relax IRModule -> fused, legalised module.

:func:`import_onnx` runs the Relax ONNX frontend (weights bound as
constants), :func:`check_outputs` holds the result to the ONNX outputs'
static shapes and dtypes, :func:`optimize` runs the CPU pipeline's dispatch,
legalisation and fusion passes (what tuning works on), and
:func:`lower_pipeline` the rest, for ``tvm.compile``. :func:`host_target` is
the llvm target of this machine's CPU. TVM is imported inside the functions
only.
"""

from __future__ import annotations

import contextlib
import re
import warnings

from collage_ml.errors import BackendError
from collage_ml.ir.graph import Graph, SubGraph


def host_target(threads: int) -> dict:
    """The llvm target dict for this machine's CPU with ``threads`` cores."""
    import tvm

    cpu = str(tvm.get_global_func("target.llvm_get_system_cpu")())
    triple = str(tvm.get_global_func("target.llvm_get_system_triple")())
    # wheels built by conda report e.g. x86_64-conda-linux-gnu; the vendor field means nothing to codegen
    triple = re.sub(r"-conda-", "-pc-", triple)
    return {"kind": "llvm", "mtriple": triple, "mcpu": cpu, "num-cores": int(threads)}


def convert_map() -> dict:
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()


def has_impl(converter, opset: int) -> bool:
    versions = [int(d[len("_impl_v"):]) for d in dir(converter) if d.startswith("_impl_v")]
    return any(v <= opset for v in versions)


def default_opset(graph: Graph) -> int:
    for o in graph.opset_imports:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _ret_types(mod) -> list:
    from tvm import relax

    ty = mod["main"].ret_ty
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def check_outputs(mod, sg: SubGraph) -> None:
    """The Relax function's outputs have the ONNX outputs' static shapes and dtypes."""
    from tvm import relax

    tys = _ret_types(mod)
    if len(tys) != len(sg.outputs):
        raise BackendError(f"tvm: the imported function has {len(tys)} outputs, the region {len(sg.outputs)}")
    for name, ty in zip(sg.outputs, tys):
        info = sg.graph.tensors[name]
        if isinstance(ty, relax.ShapeType):  # a Shape op's static result; converted at call time
            continue
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise BackendError(f"tvm: output {name!r} is not a tensor of static shape ({ty})")
        try:
            shape = tuple(int(d) for d in ty.shape.values)
        except Exception:
            raise BackendError(f"tvm: output {name!r} has a dynamic shape ({ty.shape})") from None
        if shape != tuple(info.shape) or str(ty.dtype) != info.dtype.name:
            raise BackendError(
                f"tvm: output {name!r} is {ty.dtype}{list(shape)}, ONNX says {info.dtype.name}{list(info.shape)}"
            )


def import_onnx(sg: SubGraph):
    """``sg`` as a Relax IRModule (weights bound as constants)."""
    from tvm.relax.frontend.onnx import from_onnx

    model = sg.to_onnx(check=False)
    with warnings.catch_warnings(), contextlib.redirect_stdout(None):
        # the frontend prints "Error converting operator ..." and warns about renamed inputs
        warnings.simplefilter("ignore")
        return from_onnx(model, keep_params_in_input=False, sanitize_input_names=True)


def optimize(mod, target):
    """The CPU pipeline's dispatch, legalisation and fusion passes (what tuning works on)."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    seq = tvm.transform.Sequential(
        [relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings()]
        + cpu.library_dispatch_passes(target)
        + cpu.legalize_passes(target)  # LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR
    )
    with target:
        return seq(mod)


def lower_pipeline(target):
    """The rest of the CPU pipeline. ``relax.pipeline.dataflow_lower_passes`` cannot be used in 0.27:
    it calls ``cpu_generic.dataflow_lower_passes``, which the package does not export."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return tvm.transform.Sequential(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))


def relax_ops(mod) -> set[str]:
    import tvm
    from tvm import relax

    ops: set[str] = set()

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            ops.add(e.op.name)

    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f.body, visit)
    return ops
