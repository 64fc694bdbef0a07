"""The Backend interface and the registry.

A backend is an implementation that can compile a :class:`SubGraph` into an
:class:`Executable`. It says what it can run through *patterns*
(:mod:`collage_ml.backends.patterns`): op-level patterns for library kernels,
region patterns for compilers that fuse.

Backends register with :func:`register_backend`. Third-party backends come in
through the entry-point group ``collage_ml.backends``: the entry point names a
callable (usually the Backend subclass) that returns a Backend instance.
A backend whose package is missing still registers; ``available()`` is then
False and ``unavailable_reason()`` holds the install hint. Nothing breaks at
import, because optional packages are imported inside methods only.
"""

from __future__ import annotations

import abc
import importlib.metadata
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from onnx import TensorProto

from collage_ml.backends.names import (  # noqa: F401  (configured names; re-exported as the registry's)
    configured_name, grid_text, normalise_options, parse_backend_name, split_backend_names,
)
from collage_ml.errors import BackendError, describe
from collage_ml.ir.graph import Graph, Node, SubGraph

ENTRY_POINT_GROUP = "collage_ml.backends"


class Executable(abc.ABC):
    """A compiled subgraph. Call it with one tensor per ``input_names`` entry, in that order.

    Inputs are numpy arrays or DLPack-capable tensors (torch, TVM, ...). The
    result is a list with one DLPack-capable tensor (or numpy array) per
    ``output_names`` entry. ``close()`` frees the runtime's resources.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    @abc.abstractmethod
    def __call__(self, *inputs: Any) -> list[Any]: ...

    def close(self) -> None:  # pragma: no cover - default
        pass


class Backend(abc.ABC):
    """One backend: an implementation plus a configuration, that compiles subgraphs.

    Subclasses set ``name``, ``device`` (``"cpu"`` or ``"cuda"``),
    ``install_hint`` and ``patterns``, and implement :meth:`supports`,
    :meth:`compile` and :meth:`_version`.

    A backend with configurations declares its grid in :attr:`CONFIGS` (key ->
    allowed values, the first one the default) and implements :meth:`options`
    and :meth:`from_options`. A configured backend is named
    ``base[key=value,...]`` (see :func:`parse_backend_name`); its ``name``
    lists the keys that differ from the defaults, so the all-defaults
    configuration keeps the plain name.

    Optional, with defaults here that mean "nothing special": :attr:`packages`,
    :attr:`CONFIGS`, :attr:`process_group` (read by the Runner),
    :meth:`check_process_compatible` (read by placed models) and
    :meth:`_probe`. Code outside a backend reads only what this class declares.
    """

    name: str = ""
    device: str = "cpu"
    install_hint: str = ""
    #: the packages whose versions go into measurement keys (besides the backend's own version)
    packages: tuple[str, ...] = ()
    #: the declared configuration grid: key -> allowed values (canonical spelling), the first the default
    CONFIGS: dict[str, tuple[str, ...]] = {}
    #: not None when compiling this backend changes process-wide state that other configurations cannot live
    #: with (onnxruntime's global thread pool): the Runner measures (and runs) each group in processes of its
    #: own. Subclasses may make it a property of their configuration.
    process_group: str | None = None

    def __init__(self, **config: object) -> None:
        #: constructor arguments; with the class they rebuild this backend in a worker process
        self.config: dict = dict(config)
        self._available: bool | None = None
        self._reason: str | None = None

    def spec(self) -> tuple[str, str, dict]:
        """(module, class name, config): how a worker process rebuilds this backend (:meth:`from_spec`)."""
        return (type(self).__module__, type(self).__qualname__, dict(self.config))

    @staticmethod
    def from_spec(spec: Sequence, trusted: bool = False) -> "Backend":
        """The backend a :meth:`spec` describes, built with its constructor arguments.

        By default the class must be a registered backend's (a built-in, a :func:`register_backend` call, or
        a plug-in already loaded), found in the registry by module and class name: nothing the spec names is
        imported, and anything else raises :class:`BackendError`. ``trusted=True`` imports the named class
        instead (it must be a Backend subclass): only for specs this process, or its parent, made itself
        (a worker rebuilding its parent's backends, test fixtures included), never for data from a file.
        """
        if not (isinstance(spec, (list, tuple)) and len(spec) == 3 and isinstance(spec[0], str)
                and isinstance(spec[1], str) and isinstance(spec[2], Mapping)):
            raise BackendError(f"not a backend spec (module, class, config): {str(spec)[:120]}")
        module, qualname, config = spec
        cls = _imported_class(module, qualname) if trusted else _registered_class(module, qualname)
        return cls(**dict(config))

    def check_process_compatible(self, backends: Sequence["Backend"]) -> None:
        """Raises :class:`BackendError` when this backend cannot run in one process with ``backends``
        (a placed model's, this one included): process-wide state they would need set differently, as
        onnxruntime's shared and own thread pools. The default: no constraint."""

    # -- configurations ----------------------------------------------------------------
    def options(self) -> dict[str, str]:
        """This backend's configuration, one canonical value per :attr:`CONFIGS` key."""
        return {}

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "Backend":
        """A backend of this class with ``options`` (complete and canonical: every CONFIGS key)."""
        raise BackendError(f"backend {cls.name!r} has no configurations")

    def base_name(self) -> str:
        """The name without the configuration: ``onnxruntime[spin=on]`` -> ``onnxruntime``."""
        return self.name.split("[", 1)[0]

    def configured(self, options: Mapping[str, object]) -> "Backend":
        """This backend with ``options`` changed (others keep this backend's values); validated."""
        base = self.base_name()
        if not type(self).CONFIGS:
            raise BackendError(f"backend {base!r} has no configurations; use the plain name {base!r}")
        full = dict(self.options())
        full.update(normalise_options(base, type(self).CONFIGS, options))
        return type(self).from_options(full)

    # -- availability ------------------------------------------------------------------
    def _probe(self) -> None:
        """Imports the backend's dependencies; raise ImportError/RuntimeError when unusable."""

    def available(self) -> bool:
        if self._available is None:
            try:
                self._probe()
                self._available = True
            except Exception as e:  # ImportError, missing device, broken install
                self._available = False
                self._reason = describe(e, 10**6)
                if self.install_hint:
                    self._reason += f" (install: {self.install_hint})"
        return self._available

    def unavailable_reason(self) -> str | None:
        return None if self.available() else self._reason

    def require(self) -> None:
        if not self.available():
            raise BackendError(f"backend {self.name!r} is unavailable: {self._reason}")

    @property
    def version(self) -> str:
        """The backend's version string; it is part of every measurement key."""
        if not self.available():
            return "unavailable"
        return self._version()

    @abc.abstractmethod
    def _version(self) -> str: ...

    def versions(self) -> dict[str, str]:
        out = {self.name: self.version}
        for p in self.packages:
            out[p] = package_version(p)
        return out

    # -- what it runs ---------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def patterns(self) -> Sequence["Pattern"]: ...

    @abc.abstractmethod
    def supports(self, graph: Graph, node: Node) -> bool:
        """Can this backend run ``node`` (with its shapes, dtypes and attributes)?"""

    def supports_subgraph(self, sg: SubGraph) -> bool:
        return all(self.supports(sg.graph, n) for n in sg.nodes)

    @abc.abstractmethod
    def compile(self, sg: SubGraph, threads: int = 1) -> Executable:
        """Compiles ``sg`` to run with ``threads`` intra-op threads."""

    def info(self) -> dict:
        return {
            "name": self.name,
            "device": self.device,
            "available": self.available(),
            "version": self.version,
            "kinds": sorted({p.kind for p in self.patterns}) if self.available() else [],
            "reason": self.unavailable_reason(),
        }

    def __repr__(self) -> str:
        return f"<Backend {self.name} ({self.device})>"


def package_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def to_numpy(x: Any) -> np.ndarray:
    """Any tensor a backend takes or returns (numpy, torch, TVM, ...) as a numpy array; no copy on the CPU."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # torch (a CUDA tensor is copied to the host)
        return x.detach().cpu().numpy()
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    if hasattr(x, "numpy") and callable(x.numpy):
        return np.asarray(x.numpy())
    return np.asarray(x)


def float32_boundary_node(graph: Graph, node: Node, integer_ops: Iterable[str] | None = None) -> bool:
    """For runtimes that exchange float32 tensors only (MNN, tinygrad): are ``node``'s outputs float32,
    and is every other input a constant (an initializer) after the first, which the runtime folds as a
    shape, axis or pad? ``integer_ops`` limits such constant inputs to these op types (None: any op)."""
    if any(graph.tensors[t].elem_type != TensorProto.FLOAT for t in node.outputs if t):
        return False
    for i, t in enumerate(node.inputs):
        if not t or graph.tensors[t].elem_type == TensorProto.FLOAT:
            continue
        if i == 0 or t not in graph.initializers or (integer_ops is not None and node.op_type not in integer_ops):
            return False
    return True


def require_float32_inputs(backend: str, sg: SubGraph) -> None:
    """Raises BackendError naming the first input of ``sg`` that is not float32."""
    for n in sg.inputs:
        if sg.graph.tensors[n].elem_type != TensorProto.FLOAT:
            raise BackendError(f"{backend} runs float32 region inputs only; {n!r} of {sg} is not float32")


# -- per-op support probes ----------------------------------------------------------------------
#: (backend name, backend version, op key) -> None when the op compiled alone, else why not (one line)
_OP_PROBES: dict[tuple, str | None] = {}
#: graph -> {(backend name, node index): result}, so supports() stays a dict lookup after the first call
_NODE_PROBES: "weakref.WeakKeyDictionary[Graph, dict[tuple[str, int], str | None]]" = weakref.WeakKeyDictionary()


def op_key(graph: Graph, node: Node) -> tuple:
    """What decides whether a backend can compile ``node``: domain, op, opset, attributes, and each
    input's and output's dtype and rank (and whether an input is a constant). Not shapes nor names."""
    opset = next((o.version for o in graph.opset_imports if o.domain == node.domain
                  or (node.domain in ("", "ai.onnx") and o.domain in ("", "ai.onnx"))), 0)
    ins = tuple((graph.tensors[t].elem_type, len(graph.tensors[t].shape), t in graph.initializers) if t else None
                for t in node.inputs)
    outs = tuple((graph.tensors[t].elem_type, len(graph.tensors[t].shape)) if t else None for t in node.outputs)
    return (node.domain or "", node.op_type, int(opset), node.attr_key, ins, outs)


def probe_op(backend: "Backend", graph: Graph, node: Node, compile_fn: Callable[[SubGraph], Any] | None = None) -> str | None:
    """None when ``backend`` compiles ``node`` alone, else the error's first line.

    Run once per backend (name and version) and :func:`op_key`, and cached for
    the process, so a backend that cannot compile an op declines it in
    ``supports()`` instead of failing every candidate that contains it at
    measure time (as the TVM backend's ``_probe_node`` does). ``compile_fn``
    (default: ``backend.compile(sg, threads=1)``) compiles the one-node subgraph
    in this process; it must be safe to call here (no crash-prone compilers).
    """
    memo = _NODE_PROBES.setdefault(graph, {})
    mk = (backend.name, node.index)
    if mk in memo and graph.nodes[node.index] is node:
        return memo[mk]
    key = (backend.name, backend.version, op_key(graph, node))
    if key not in _OP_PROBES:
        try:
            sg = graph.subgraph(1 << node.index)
            exe = compile_fn(sg) if compile_fn is not None else backend.compile(sg, threads=1)
            close = getattr(exe, "close", None)
            if callable(close):
                close()
            _OP_PROBES[key] = None
        except Exception as e:
            _OP_PROBES[key] = describe(e, 200)
    if graph.nodes[node.index] is node:
        memo[mk] = _OP_PROBES[key]
    return _OP_PROBES[key]


def probe_failures(backend_name: str | None = None) -> dict[tuple, str]:
    """The ops that failed their probe in this process: (backend, version, op key) -> reason."""
    return {k: v for k, v in _OP_PROBES.items() if v is not None and (backend_name is None or k[0] == backend_name)}


# -- registry --------------------------------------------------------------------------------
_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
_ENTRY_POINTS_LOADED = False


def _registered_class(module: str, qualname: str) -> type[Backend]:
    """The class of a registered backend with this module and class name; never imports ``module``."""
    registered()
    made = [type(b) for b in _INSTANCES.values()]
    for cls in [f for f in _FACTORIES.values() if isinstance(f, type)] + made:
        if cls.__module__ == module and cls.__qualname__ == qualname and issubclass(cls, Backend):
            return cls
    raise BackendError(f"{module}.{qualname} is not a registered backend; only registered backends are "
                       "rebuilt from a spec")


def _imported_class(module: str, qualname: str) -> type[Backend]:
    """The class ``module.qualname``, imported: for specs from this process or its parent only."""
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Backend)):
        raise BackendError(f"{module}.{qualname} is not a Backend class")
    return obj


def register_backend(name: str, factory: Callable[[], Backend] | None = None):
    """Registers a backend factory under ``name``; usable as a class decorator."""

    def deco(f: Callable[[], Backend]):
        _FACTORIES[name] = f
        for k in [k for k in _INSTANCES if k == name or k.startswith(name + "[")]:
            del _INSTANCES[k]
        return f

    return deco(factory) if factory is not None else deco


def _load_builtin() -> None:
    # importing the modules registers them; none imports an optional package at module level
    from collage_ml.backends import builtin  # noqa: F401


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _FACTORIES:
            continue
        _FACTORIES[ep.name] = _lazy_entry_point(ep)


def _lazy_entry_point(ep) -> Callable[[], Backend]:
    def factory() -> Backend:
        try:
            obj = ep.load()
        except Exception as e:
            raise BackendError(f"backend plug-in {ep.name!r} ({ep.value}) failed to load: {e}") from None
        return obj()

    return factory


def registered() -> list[str]:
    _load_builtin()
    _load_entry_points()
    return list(_FACTORIES)


def get_backend(name: str) -> Backend:
    """The backend registered as ``name`` (it may be unavailable: check ``available()``).

    ``name`` may carry a configuration, ``base[key=value,...]``: the result is
    ``base`` configured so, named canonically (``get_backend("onnxruntime[spin=1]").name
    == "onnxruntime[spin=on]"``); the all-defaults configuration is the plain backend.
    """
    if name in _INSTANCES:
        return _INSTANCES[name]
    names = registered()
    base, options = parse_backend_name(name)
    if base not in _FACTORIES:
        import difflib

        close = difflib.get_close_matches(base, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise BackendError(f"unknown backend {base!r}; registered: {', '.join(names)}{hint}")
    if base not in _INSTANCES:
        _INSTANCES[base] = _FACTORIES[base]()
    plain = _INSTANCES[base]
    if base == name:
        return plain
    b = plain.configured(options)
    if b.name == plain.name:  # all defaults: the plain backend itself
        b = plain
    b = _INSTANCES.setdefault(b.name, b)
    _INSTANCES[name] = b
    return b


def all_backends() -> list[Backend]:
    return [get_backend(n) for n in registered()]


def default_backends(device: str = "cpu") -> list[Backend]:
    """The default set: onnxruntime, openvino, torch and inductor on CPU (tvm is opt-in there)."""
    if device == "cpu":
        names = ["onnxruntime", "openvino", "torch", "inductor"]
    else:
        names = [n for n in registered() if get_backend(n).device == device]
    return [b for n in names if n in registered() and (b := get_backend(n)).available()]


def resolve_backends(names: Iterable[str] | str | None) -> list[Backend]:
    """Backends by name (a comma-separated string or a list); None gives the defaults.

    Names may carry configurations (``onnxruntime[spin=on,opt=basic],openvino``): the
    string is split at top-level commas only.

    An unknown or unavailable backend named explicitly is an error.
    """
    if names is None:
        return default_backends()
    if isinstance(names, str):
        names = split_backend_names(names)
    out = []
    for n in names:
        b = get_backend(n)
        b.require()
        out.append(b)
    if not out:
        raise BackendError("no backends given")
    return out


from collage_ml.backends.patterns import Pattern  # noqa: E402  (patterns import Graph only)
