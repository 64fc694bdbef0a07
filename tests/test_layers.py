"""Layers import only downward (DESIGN.md): a module may import from its own layer and the layers below.

The order, bottom to top (a module's layer is its top-level module or package under ``collage_ml``):

    errors, cost, paths, defaults, ui, ort_pool, argtypes < ir < backends < candidates, plan, placed < measure
    < db < featurize < models < search < collector < api, viz < cli, cli_collect, __main__, __init__

``ui`` (progress bars and tables, on rich) is at the bottom because place (``search``), collect and train
(``models``) all use it. ``placed`` (compiled plans, saved and loaded) shares the plan's layer:
:meth:`Plan.compile` returns a PlacedModel, and the measurement layer compiles plans to time them end to end
(``measure/e2e.py``), so placed models sit below ``measure`` and never time themselves.

Imports inside functions count: a lazy import is still a dependency. The package root itself
(``import collage_ml`` for ``__version__`` or ``__file__``) may be imported from anywhere: its ``__init__``
re-exports the API lazily and imports nothing. :data:`KNOWN` lists the upward imports
that exist today (none now; issue: one tuner, downward layers); a new one fails this test, and so
does a listed one that has gone (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "collage_ml"

ORDER = [
    {"errors", "cost", "paths", "defaults", "ui", "ort_pool", "argtypes"},
    {"ir"},
    {"backends"},
    {"candidates", "plan", "placed"},
    {"measure"},
    {"db"},
    {"featurize"},
    {"models"},
    {"search"},
    {"collector"},
    {"api", "viz"},
    {"cli", "cli_collect", "__main__", "__init__"},
]
LAYER = {name: i for i, names in enumerate(ORDER) for name in names}

#: (importing module, imported module) pairs that go upward today: none left; keep it that way
KNOWN: set[tuple[str, str]] = set()


def _unit(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _module(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["collage_ml", *parts])


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    pkg = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("collage_ml"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "collage_ml":  # from collage_ml import x: a submodule, or a name of the (lazy) root
                out.update(f"collage_ml.{a.name}" if a.name in LAYER else "collage_ml" for a in node.names)
            elif mod.startswith("collage_ml"):
                out.add(mod)
    return out


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PKG.rglob("*.py")):
        unit = _unit(path)
        assert unit in LAYER, f"{path.relative_to(PKG.parent)}: give {unit!r} a layer in tests/test_layers.py"
        for mod in _imports(path):
            parts = mod.split(".")
            if len(parts) < 2:  # the package root: its __init__ imports nothing until a name is used
                continue
            target = parts[1]
            assert target in LAYER, f"{_module(path)} imports {mod}: give {target!r} a layer"
            if LAYER[target] > LAYER[unit]:
                found.add((_module(path), ".".join(parts[:3]) if len(parts) > 2 else mod))
    return found


def test_layers_import_only_downward():
    found = upward_imports()
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert not new, "upward imports (a lower layer importing a higher one): " + "; ".join(f"{a} -> {b}" for a, b in new)
    assert not gone, "these upward imports are gone: remove them from KNOWN: " + "; ".join(f"{a} -> {b}" for a, b in gone)
