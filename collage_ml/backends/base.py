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
from typing import Any, Callable, Iterable, Sequence

import numpy as np

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
    """One backend: an implementation (plus, later, a configuration) that compiles subgraphs.

    Subclasses set ``name``, ``device`` (``"cpu"`` or ``"cuda"``),
    ``install_hint`` and ``patterns``, and implement :meth:`supports`,
    :meth:`compile` and :meth:`_version`.
    """

    name: str = ""
    device: str = "cpu"
    install_hint: str = ""
    #: the packages whose versions go into measurement keys (besides the backend's own version)
    packages: tuple[str, ...] = ()

    def __init__(self, **config: object) -> None:
        #: constructor arguments; with the class they rebuild this backend in a worker process
        self.config: dict = dict(config)
        self._available: bool | None = None
        self._reason: str | None = None

    def spec(self) -> tuple[str, str, dict]:
        """(module, class name, config): how a worker process rebuilds this backend."""
        return (type(self).__module__, type(self).__qualname__, dict(self.config))

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


# -- registry --------------------------------------------------------------------------------
_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
_ENTRY_POINTS_LOADED = False


def register_backend(name: str, factory: Callable[[], Backend] | None = None):
    """Registers a backend factory under ``name``; usable as a class decorator."""

    def deco(f: Callable[[], Backend]):
        _FACTORIES[name] = f
        _INSTANCES.pop(name, None)
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
    """The backend registered as ``name`` (it may be unavailable: check ``available()``)."""
    names = registered()
    if name not in _INSTANCES:
        if name not in _FACTORIES:
            import difflib

            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise BackendError(f"unknown backend {name!r}; registered: {', '.join(names)}{hint}")
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


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

    An unknown or unavailable backend named explicitly is an error.
    """
    if names is None:
        return default_backends()
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out = []
    for n in names:
        b = get_backend(n)
        b.require()
        out.append(b)
    if not out:
        raise BackendError("no backends given")
    return out


from collage_ml.backends.patterns import Pattern  # noqa: E402  (patterns import Graph only)
