"""``tvm``: Apache TVM 0.27 (Relax), region patterns, optional MetaSchedule tuning.

A region is exported with :meth:`SubGraph.to_onnx`, imported with the Relax
ONNX frontend (weights bound as constants, not function parameters), run
through the CPU legalisation and fusion passes, optionally tuned with
MetaSchedule, compiled with ``tvm.compile`` for an ``llvm`` target of this
machine's CPU and run on ``relax.VirtualMachine``.

Untuned, TVM's kernels are naive loop nests (no schedule, no threading); on a
3x3 convolution and a small MatMul they are about 50x slower than onnxruntime
(MLAS), which is why tvm is not in the default CPU backend set (see ``docs/tvm.md``).
``TVMBackend(trials=N)`` (or ``COLLAGE_ML_TVM_TRIALS=N``) tunes every task of
a region with N MetaSchedule trials, keeping the records in a persistent JSON
database (default ``cache_dir()/tvm-tuning``) so that a task is tuned once per
target and budget; tuning failures fall back to the untuned build with a
warning.

This module holds the backend; its concerns live beside it:

- :mod:`.tvm_support`: which ops it declines before any probe;
- :mod:`.tvm_relax`: the Relax pipeline (import, output checks, passes, target);
- :mod:`.tvm_tuning`: MetaSchedule and the tuning store on disk;
- :mod:`.tvm_runtime`: TVM's thread pools and the executable;
- :mod:`.tvm_bench`: the benchmark behind docs/tvm.md.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Sequence

from collage_ml.backends.base import Backend, Executable, register_backend
from collage_ml.backends.patterns import RegionPattern
from collage_ml.backends.tvm_relax import (
    check_outputs, convert_map, default_opset, has_impl, host_target, import_onnx, lower_pipeline, optimize, relax_ops,
)
from collage_ml.backends.tvm_runtime import TVMExecutable, first_line, setup_runtime_env
from collage_ml.backends.tvm_support import (
    BUILTIN_OPS, DENIED_OPS, INDEXING_OPS, SHAPE_CONSUMERS, SUPPORTED_ELEM_TYPES, constant_indices_in_range, io_key,
)
from collage_ml.backends.tvm_tuning import run_tuning, target_db_dir, tune_and_apply, tuning_records
from collage_ml.errors import BackendError
from collage_ml.ir.graph import Graph, Node, SubGraph

TRIALS_ENV = "COLLAGE_ML_TVM_TRIALS"

__all__ = ["TRIALS_ENV", "TVMBackend", "TVMExecutable", "tuning_records"]


@register_backend("tvm")
class TVMBackend(Backend):
    """TVM (Relax) on the host CPU, untuned by default; ``trials > 0`` tunes with MetaSchedule.

    ``trials``: MetaSchedule trials per task (None: ``$COLLAGE_ML_TVM_TRIALS`` or 0).
    ``db_dir``: the persistent tuning database (None: ``cache_dir()/"tvm-tuning"``).
    """

    name = "tvm"
    device = "cpu"
    install_hint = "pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1"
    packages = ("apache-tvm", "apache-tvm-ffi")

    def __init__(self, trials: int | None = None, db_dir: str | os.PathLike | None = None):
        if trials is None:
            env = os.environ.get(TRIALS_ENV, "").strip()
            try:
                trials = int(env) if env else 0
            except ValueError:
                raise BackendError(f"{TRIALS_ENV}={env!r}: expected a whole number of trials per task") from None
        trials = int(trials)
        if trials < 0:
            raise BackendError(f"tvm: trials must be >= 0, got {trials}")
        super().__init__(trials=trials, db_dir=None if db_dir is None else os.fspath(db_dir))
        self.trials = trials
        self._db_dir = Path(db_dir) if db_dir is not None else None
        self._patterns = (RegionPattern("tvm-region", max_size=16),)
        self._probe_cache: dict[tuple, bool] = {}
        self._static_cache: dict[tuple, bool] = {}

    @property
    def db_dir(self) -> Path:
        if self._db_dir is not None:
            return self._db_dir
        from collage_ml.paths import cache_dir

        return cache_dir() / "tvm-tuning"

    # -- availability ---------------------------------------------------------------------------
    def _probe(self) -> None:
        setup_runtime_env()
        import tvm
        from tvm import relax  # noqa: F401
        from tvm.relax.frontend import onnx  # noqa: F401

        if not tvm.runtime.enabled("llvm"):
            raise RuntimeError("this TVM build has no LLVM codegen")
        if self.device == "cuda" and not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):
            raise RuntimeError("TVM sees no CUDA device (runtime.enabled('cuda') or tvm.cuda(0).exist is False)")

    def _version(self) -> str:
        import tvm

        if self.device != "cpu":
            return f"{tvm.__version__}+dlight"
        return f"{tvm.__version__}+{'ms%d' % self.trials if self.trials > 0 else 'untuned'}"

    # -- where it runs (subclasses for other devices override these) ------------------------------
    def make_target(self, threads: int):
        import tvm

        host = host_target(threads)
        if self.device == "cuda":
            major, minor = str(tvm.cuda(0).compute_version).split(".")[:2]
            return tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}", "host": host})
        return tvm.target.Target(host)

    def runtime_device(self):
        import tvm

        return tvm.cuda(0) if self.device == "cuda" else tvm.cpu(0)

    @property
    def patterns(self):
        return self._patterns

    # -- what it runs -----------------------------------------------------------------------
    def supports(self, graph: Graph, node: Node) -> bool:
        if not self.available():
            return False
        if node.domain not in ("", "ai.onnx") or node.op_type in DENIED_OPS:
            return False
        tensors = graph.tensors
        names = [t for t in node.inputs + node.outputs if t]
        if any(tensors[t].elem_type not in SUPPORTED_ELEM_TYPES for t in names):
            return False
        if node.op_type in INDEXING_OPS and not constant_indices_in_range(graph, node):
            return False
        if node.op_type == "Shape" and any(
            graph.nodes[c].op_type not in SHAPE_CONSUMERS for t in node.outputs for c in graph.consumers.get(t, ())
        ):
            return False
        opset = default_opset(graph)
        skey = (node.op_type, opset)
        ok = self._static_cache.get(skey)
        if ok is None:
            conv = convert_map().get(node.op_type)
            ok = self._static_cache[skey] = conv is not None and has_impl(conv, opset)
        if not ok:
            return False
        return self._probe_node(graph, node, opset)

    def _probe_node(self, graph: Graph, node: Node, opset: int) -> bool:
        """Imports and legalises the node alone (about 2 ms, cached by op, attributes and types).

        Catches converters that reject an attribute or a shape, ops without a legalisation, and
        outputs whose shape or dtype differs from ONNX's.
        """
        key = (node.op_type, opset, node.attr_key, io_key(graph, node))
        hit = self._probe_cache.get(key)
        if hit is not None:
            return hit
        ok = False
        try:
            from tvm import relax

            sg = graph.subgraph(1 << node.index)
            mod = import_onnx(sg)
            check_outputs(mod, sg)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = relax.transform.LegalizeOps()(mod)
            ok = not (relax_ops(mod) - BUILTIN_OPS)
        except Exception:
            ok = False
        self._probe_cache[key] = ok
        return ok

    # -- compile --------------------------------------------------------------------------------
    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        threads = max(1, int(threads))
        import tvm
        from tvm import relax

        info: dict = {"tuned": False, "trials": self.trials, "tasks": 0, "tuned_tasks": 0, "reused_tasks": 0}
        t0 = time.perf_counter()
        try:
            target = self.make_target(threads)
            mod = import_onnx(sg)
        except Exception as e:
            raise BackendError(f"tvm could not import {sg}: {first_line(e)}") from None
        check_outputs(mod, sg)
        if self.device != "cpu":
            return self._compile_gpu(mod, target, sg, threads, info)
        try:
            mod = optimize(mod, target)
        except Exception as e:
            raise BackendError(f"tvm could not optimise {sg}: {first_line(e)}") from None
        info["import_s"] = time.perf_counter() - t0
        if self.trials > 0:
            t1 = time.perf_counter()
            try:
                mod = self._tune_and_apply(mod, target, info)
            except Exception as e:
                warnings.warn(f"tvm: MetaSchedule tuning failed, using the untuned build: {first_line(e)}")
                info["tuned"] = False
                info["tune_error"] = first_line(e)
            info["tune_s"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        try:
            exe = tvm.compile(mod, target, relax_pipeline=lower_pipeline(target))
            vm = relax.VirtualMachine(exe, self.runtime_device())
        except Exception as e:
            raise BackendError(f"tvm could not compile {sg}: {first_line(e)}") from None
        info["build_s"] = time.perf_counter() - t2
        return TVMExecutable(vm, sg, threads, info)

    def _compile_gpu(self, mod, target, sg: SubGraph, threads: int, info: dict) -> Executable:
        """TVM's default pipeline for the GPU target: legalisation, fusion and dlight's default
        schedules (MetaSchedule tuning is CPU-only here; ``trials`` is ignored)."""
        import tvm
        from tvm import relax

        t0 = time.perf_counter()
        try:
            mod = relax.transform.DecomposeOpsForInference()(mod)
            exe = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
            vm = relax.VirtualMachine(exe, self.runtime_device())
        except Exception as e:
            raise BackendError(f"tvm could not compile {sg} for {self.device}: {first_line(e)}") from None
        info["build_s"] = time.perf_counter() - t0
        return TVMExecutable(vm, sg, threads, info, device=self.runtime_device())

    # -- MetaSchedule (tvm_tuning) -------------------------------------------------------------
    def target_db_dir(self, target) -> Path:
        """This target's tuning database: records are kept per CPU model and core count."""
        return target_db_dir(self.db_dir, target)

    def _tune_and_apply(self, mod, target, info: dict):
        """Tunes the tasks the database lacks for this budget, then applies the best records."""
        return tune_and_apply(mod, target, self.trials, self.target_db_dir(target), info, self._tune)

    def _tune(self, db, tasks: Sequence, target) -> None:
        run_tuning(db, tasks, target, self.trials)
