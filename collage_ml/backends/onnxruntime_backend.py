"""``onnxruntime``: ONNX Runtime's CPU execution provider, region patterns.

Sessions use their own intra-op pool of ``threads`` threads with spinning
off by default: with spinning on, a chain of sessions each leaves its workers
spinning for ~40 ms after a call, which slows the next partition (15 segment
sessions took 30.5 ms against a 1.75 ms sum, STACK-NOTES.md). ``spin=True``
gives the single-session configuration ORT uses by default.

Configurations (:attr:`OnnxRuntimeBackend.CONFIGS`, defaults first)::

    onnxruntime[spin=off|on, opt=all|extended|basic|none, pool=own|shared, skipln=on|off]

- ``spin``: whether the intra-op pool's idle workers spin before sleeping
  (``session.intra_op.allow_spinning`` / ``inter_op``).
- ``opt``: the graph optimisation level. ``extended`` is ``all`` without the
  layout transformers: convolutions stay NCHW (``FusedConv``) instead of
  NCHWc blocked ``nchwc.Conv`` with reorders at the edges; ``basic`` keeps only
  constant folding and redundant-node elimination, ``none`` runs the graph as
  written. (ORT's ``ORT_ENABLE_LAYOUT`` level optimises exactly like ``all``
  on the CPU provider in 1.32, so it is not declared.)
- ``pool``: ``own`` gives each session its own intra-op pool of ``threads``
  threads. ``shared`` makes every session of the process use ONNX Runtime's
  one global pool (``onnxruntime.set_global_thread_pool_sizes`` plus
  ``SessionOptions.use_per_session_threads = False``), so the partitions of a
  placed model (whatever their ``opt``) share ``threads`` threads instead of
  owning ``threads - 1`` workers each.
- ``skipln``: ``off`` turns ORT's ``SkipLayerNormFusion`` off (``disabled_optimizers``),
  so a residual ``Add`` followed by ``LayerNormalization`` runs as those two
  kernels instead of the fused ``com.microsoft.SkipLayerNormalization``. On
  the Zen 3 (AMD EPYC family 25 model 1, AVX2) the fused kernel of
  onnxruntime 1.32 ran 1.2x to 7.2x slower than the two it replaces
  (benchmarks/skip_layernorm.py, docs/results/placement.md, "Add +
  LayerNorm"). Other fusions stay on.

The rules of the global pool, as onnxruntime 1.32's Python API has them
(tests/test_backend_configs.py checks each one):

- it is created once per process (a second ``set_global_thread_pool_sizes``
  fails), so its size is the ``threads`` of the first ``pool=shared`` compile;
  a later compile with another thread count raises :class:`BackendError`;
- its spinning cannot be set from Python: it always spins, whatever the
  session's ``allow_spinning``. So ``pool=shared`` is only declared with
  ``spin=on``, and ``onnxruntime[pool=shared]`` (spin off) is refused;
- once it exists, onnxruntime refuses every new session with its own pool
  ("use_per_session_threads must be false when using a global thread pool"),
  ours and anybody's (``Graph.reference`` included, unless it passes its
  options through :func:`fit_session_options`); sessions created before
  keep working. So a process that compiled a ``pool=shared`` configuration
  can no longer compile a ``pool=own`` one: that raises :class:`BackendError`
  up front, and a plan must not mix the two (:func:`check_pool_compatible`).
  Backends that change process-wide state say so in :attr:`OnnxRuntimeBackend.process_group`.

The pool's state lives in :mod:`collage_ml.ort_pool`, at the bottom layer, so
the reference run and the importer read it without importing this backend.
"""

from __future__ import annotations

from typing import Any, Sequence

from collage_ml.backends.base import Backend, Executable, configured_name, probe_op, register_backend, to_numpy
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError, first_line
from collage_ml.ir.graph import Graph, Node, SubGraph
# the process's global pool state lives at the bottom layer, where reference runs read it too
from collage_ml.ort_pool import ensure_global_pool, fit_session_options, global_pool_threads

ORT_DOMAINS = ("", "ai.onnx", "com.microsoft")


class OrtExecutable(Executable):
    def __init__(self, session, input_names: Sequence[str], output_names: Sequence[str]):
        self.session = session
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._sess_inputs = [i.name for i in session.get_inputs()]
        self._sess_outputs = [o.name for o in session.get_outputs()]

    def __call__(self, *inputs: Any) -> list[Any]:
        feeds = {n: to_numpy(x) for n, x in zip(self._sess_inputs, inputs)}
        return self.session.run(self._sess_outputs, feeds)

    def close(self) -> None:
        self.session = None


#: ORT_ENABLE_LAYOUT is left out: in 1.32 it optimises exactly as ORT_ENABLE_ALL on the CPU provider
OPT_LEVELS = ("all", "extended", "basic", "none")

#: the optimizers each ``skipln`` value turns off (``InferenceSession(disabled_optimizers=...)``)
SKIPLN_DISABLED = {"on": (), "off": ("SkipLayerNormFusion",)}


def session_level(opt_level: str):
    """onnxruntime's GraphOptimizationLevel for one of :data:`OPT_LEVELS`."""
    import onnxruntime as ort

    return {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt_level]


def make_session(model_bytes: bytes, threads: int, spin: bool, opt_level: str = "all", providers=None,
                 pool: str = "own", skipln: str = "on", optimized_path: str | None = None):
    """An InferenceSession with this project's options. ``optimized_path``, when given, is where
    onnxruntime writes the graph it optimised (for tests and for looking at what a configuration runs)."""
    import onnxruntime as ort

    if pool == "shared":
        ensure_global_pool(threads)
    elif global_pool_threads() is not None:
        raise BackendError(
            "this process uses onnxruntime's global thread pool (a pool=shared configuration ran here), and "
            "onnxruntime then refuses sessions with their own pool: run pool=own configurations in another process"
        )
    so = ort.SessionOptions()
    if pool == "shared":
        so.use_per_session_threads = False  # the pool's size and spinning are the global pool's
    else:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "1" if spin else "0")
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = session_level(opt_level)
    if optimized_path is not None:
        so.optimized_model_filepath = optimized_path
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes, so, providers=providers or ["CPUExecutionProvider"],
                                disabled_optimizers=list(SKIPLN_DISABLED[skipln]))


def check_pool_compatible(backends: Sequence[Backend]) -> None:
    """Raises BackendError when ``backends`` (e.g. a plan's) mix ORT ``pool=shared`` and ``pool=own``
    configurations, which cannot run in one process (see the module docstring)."""
    pools = {getattr(b, "pool", None) for b in backends if isinstance(b, OnnxRuntimeBackend)}
    if {"own", "shared"} <= pools:
        names = sorted({b.name for b in backends if isinstance(b, OnnxRuntimeBackend)})
        raise BackendError(
            f"onnxruntime configurations with pool=shared and pool=own cannot run in one process: {', '.join(names)}"
        )


@register_backend("onnxruntime")
class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    device = "cpu"
    install_hint = "pip install onnxruntime==1.32.0"
    packages = ("onnxruntime",)
    CONFIGS = {
        "spin": ("off", "on"),
        "opt": OPT_LEVELS,
        "pool": ("own", "shared"),
        "skipln": ("on", "off"),
    }

    def __init__(self, spin: bool = False, opt_level: str = "all", pool: str = "own", skipln: str = "on"):
        # pool and skipln go into the config only when they are not the default, so subclasses whose
        # constructors predate them (and specs stored in old plans) still rebuild
        cfg: dict = {"spin": spin, "opt_level": opt_level}
        if pool != "own":
            cfg["pool"] = pool
        if skipln != "on":
            cfg["skipln"] = skipln
        super().__init__(**cfg)
        if opt_level not in OPT_LEVELS:
            raise BackendError(f"onnxruntime: opt={opt_level} is not one of {'|'.join(OPT_LEVELS)}")
        if pool not in self.CONFIGS["pool"]:
            raise BackendError(f"onnxruntime: pool={pool} is not one of own|shared")
        if skipln not in SKIPLN_DISABLED:
            raise BackendError(f"onnxruntime: skipln={skipln} is not one of on|off")
        if pool == "shared" and not spin:
            raise BackendError(
                "onnxruntime[pool=shared] needs spin=on: onnxruntime's global pool always spins (its Python API "
                "cannot turn spinning off), so name it onnxruntime[pool=shared,spin=on]"
            )
        self.spin = bool(spin)
        self.opt_level = opt_level
        self.pool = pool
        self.skipln = skipln
        cname = configured_name(type(self).name, self.CONFIGS, self.options())
        if cname != type(self).name:  # the all-defaults configuration keeps the class's name
            self.name = cname
        self._patterns = (RegionPattern("onnxruntime-region", max_size=16),)

    def options(self) -> dict[str, str]:
        return {"spin": "on" if self.spin else "off", "opt": self.opt_level, "pool": self.pool, "skipln": self.skipln}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "OnnxRuntimeBackend":
        return cls(spin=options["spin"] == "on", opt_level=options["opt"], pool=options["pool"],
                   skipln=options["skipln"])

    @property
    def process_group(self) -> str | None:
        """Not None when compiling this backend changes process-wide state that other
        configurations cannot live with: measure (and run) each group in its own process."""
        return "onnxruntime-global-pool" if self.pool == "shared" else None

    def check_process_compatible(self, backends: Sequence[Backend]) -> None:
        check_pool_compatible(backends)

    def _probe(self) -> None:
        import onnxruntime  # noqa: F401

    def _version(self) -> str:
        import onnxruntime as ort

        v = f"{ort.__version__}+spin{int(self.spin)}-{self.opt_level}"
        if self.pool == "shared":
            v += "-poolshared"
        return v + "-noskipln" if self.skipln == "off" else v

    @property
    def patterns(self):
        return self._patterns

    def supports(self, graph: Graph, node: Node) -> bool:
        # an op (with its attributes, dtypes and opset) that onnxruntime cannot build a session for is
        # declined here once, instead of failing every candidate that contains it
        return node.domain in ORT_DOMAINS and probe_op(self, graph, node, self._probe_session) is None

    def _probe_session(self, sg: SubGraph):
        """A CPU session for ``sg`` with this configuration's optimisation level, one thread of its own
        (or the process's global pool, once one exists): the probe never creates the global pool."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.graph_optimization_level = session_level(self.opt_level)
        so.log_severity_level = 3
        fit_session_options(so)
        return ort.InferenceSession(sg.to_onnx().SerializeToString(), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(SKIPLN_DISABLED[self.skipln]))

    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        self.require()
        model = sg.to_onnx().SerializeToString()
        try:
            sess = make_session(model, threads, self.spin, self.opt_level, pool=self.pool, skipln=self.skipln)
        except BackendError:
            raise
        except Exception as e:
            raise BackendError(f"onnxruntime could not compile {sg}: {first_line(e)}") from None
        return OrtExecutable(sess, sg.inputs, sg.outputs)
