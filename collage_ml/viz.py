"""Pictures and tables of a placed model: which backend runs which nodes, and what each hand-off costs.

:class:`PlanView` reads a :class:`~collage_ml.plan.Plan` over its
:class:`~collage_ml.ir.Graph` (and, when given, the placement report and the
measurement database) without compiling anything:

- :meth:`PlanView.write_svg` lays the graph out with Graphviz's ``dot``:
  one node per ONNX node, labelled with its op type; one cluster per partition
  (an SVG ``<g class="cluster" id="partition-K">``), filled with its backend's
  colour; every tensor that crosses from one partition into another drawn as a
  bold dashed red hand-off edge (``id="handoff-…"``), labelled with its size and
  the measured hand-off cost; a legend and the partition table below.
- :meth:`PlanView.table` is that partition table for the terminal: each
  partition's ops, measured latency and incoming hand-off cost.

Partitions are numbered in execution order. A partition's latency is the
plan's (the op-level DP's per-candidate measurement) or, when the plan does not
carry one (merged regions, single-backend plans), the database's measurement of
the same subgraph on the same backend and hardware. Hand-off costs come from
the database's boundary table (README, "Measurement"), per ordered backend pair,
interpolated at the tensor's size; "-" when the pair was never measured.
"""

from __future__ import annotations

import html
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from collage_ml.errors import CollageError, ModelError
from collage_ml.ir.graph import Graph
from collage_ml.plan import Plan

#: fill colours of the backends shipped with collage-ml (ColorBrewer Set3); other backends take EXTRA in order
COLOURS = {
    "onnxruntime": "#8dd3c7", "openvino": "#bebada", "torch": "#fdb462", "inductor": "#fb8072",
    "tvm": "#80b1d3", "mnn": "#b3de69", "tinygrad": "#fccde5", "cuda": "#ccebc5",
}
EXTRA = ("#ffffb3", "#bc80bd", "#d9d9d9", "#ffed6f", "#a6cee3", "#fdbf6f", "#cab2d6", "#b2df8a", "#fb9a99")
HANDOFF_COLOUR = "#d62728"
INSTALL_HINT = "install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz)"


class GraphvizMissing(CollageError):
    """Graphviz's ``dot`` (or its Python binding) is not installed."""


@dataclass
class Handoff:
    """A tensor produced in partition ``src`` and read in partition ``dst`` (execution-order numbers)."""

    tensor: str
    src: int
    dst: int
    nbytes: int
    cost_ms: float | None = None


@dataclass
class PartitionView:
    index: int  # execution order
    backend: str
    nodes: list[int]
    ops: dict[str, int]
    measured_ms: float | None = None
    latency_from: str = ""  # "plan", "database" or ""
    handoffs_in: list[Handoff] = field(default_factory=list)

    @property
    def handoff_ms(self) -> float | None:
        """The measured cost of the hand-offs into this partition (None when none of them is known)."""
        known = [h.cost_ms for h in self.handoffs_in if h.cost_ms is not None]
        return sum(known) if known else None


def read_placed(path: str | Path) -> tuple[Graph, Plan, dict | None]:
    """(graph, plan, report or None) of a model saved with ``PlacedModel.save(dir)``, without compiling it."""
    from collage_ml.ir.importers import from_onnx, load_onnx_file

    d = Path(path)
    if not (d / "plan.json").exists() or not (d / "model.onnx").exists():
        raise ModelError(f"{d}: not a saved placed model (expected plan.json and model.onnx)")
    try:
        text = (d / "plan.json").read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"{d / 'plan.json'}: cannot read it ({e})") from None
    plan = Plan.from_json(text)
    graph = from_onnx(load_onnx_file(d / "model.onnx"), name=plan.model)
    plan.validate(graph)
    report = None
    if (d / "report.json").exists():
        try:
            report = json.loads((d / "report.json").read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            report = None
        if not isinstance(report, dict):
            report = None
    return graph, plan, report


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            v = nbytes / scale
            return f"{v:.0f} {unit}" if v >= 10 else f"{v:.1f} {unit}"
    return f"{nbytes} B"


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.0f} us" if v < 0.1 else f"{v:.3f} ms"


def _ops(hist: Mapping[str, int], limit: int = 6) -> str:
    items = sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))
    parts = [f"{op}\u00d7{n}" if n > 1 else op for op, n in items[:limit]]
    if len(items) > limit:
        parts.append(f"+{len(items) - limit} more")
    return " ".join(parts)


class PlanView:
    """A plan over its graph, with what the report and the database know about it (module docstring)."""

    def __init__(self, graph: Graph, plan: Plan, report: Mapping[str, Any] | None = None, db: Any = None):
        plan.validate(graph)
        self.graph = graph
        self.plan = plan
        self.report = dict(report or {})
        self.hardware = plan.hardware or str(self.report.get("hardware") or "")
        order = plan.execution_order(graph)
        self.partitions: list[PartitionView] = []
        owner: dict[int, int] = {}
        for k, pi in enumerate(order):
            p = plan.partitions[pi]
            hist: dict[str, int] = {}
            for n in p.nodes:
                op = graph.nodes[n].op_type
                hist[op] = hist.get(op, 0) + 1
                owner[n] = k
            self.partitions.append(PartitionView(k, p.backend, sorted(p.nodes), hist, p.measured_ms,
                                                 "plan" if p.measured_ms is not None else ""))
        self.owner = owner
        self.handoffs: list[Handoff] = []
        for part in self.partitions:
            seen: set[str] = set()
            for n in part.nodes:
                for t in graph.nodes[n].inputs:
                    src = graph.producer.get(t)
                    if src is None or owner[src] == part.index or t in seen:
                        continue
                    seen.add(t)
                    h = Handoff(t, owner[src], part.index, graph.tensors[t].nbytes)
                    part.handoffs_in.append(h)
                    self.handoffs.append(h)
        self.backends = sorted({p.backend for p in self.partitions})
        extra = iter(EXTRA)
        self.colours = {b: COLOURS.get(b) or next(extra, "#ffffff") for b in self.backends}
        if db is not None:
            self._read_db(db)

    # -- what the database knows --------------------------------------------------------
    def _read_db(self, db: Any) -> None:
        from collage_ml.db import Database

        if not self.hardware:
            return
        if isinstance(db, Database):
            self._lookup(db)
            return
        with Database(db, create=False, readonly=True) as opened:
            self._lookup(opened)

    def _lookup(self, db) -> None:
        from collage_ml.measure.boundary import BoundaryTable

        if self.handoffs:
            table = BoundaryTable(db.boundaries(hardware=self.hardware))
            for h in self.handoffs:
                c = table.cost(self.partitions[h.src].backend, self.partitions[h.dst].backend, h.nbytes)
                h.cost_ms = None if c is None else c * 1e3
        want: dict[str, dict[str, list[PartitionView]]] = {}
        for p in self.partitions:
            if p.measured_ms is None:
                sg = self.graph.subgraph(p.nodes)
                want.setdefault(p.backend, {}).setdefault(sg.hash, []).append(p)
        for backend, by_hash in want.items():
            for m in db.measurements(hardware=self.hardware, backend=backend, valid=True):
                for p in by_hash.get(m.key.subgraph_hash, ()):  # the latest measurement wins
                    p.measured_ms, p.latency_from = m.median * 1e3, "database"

    # -- the table --------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One dict per partition, in execution order (what :meth:`table` and the SVG's table show)."""
        return [
            {"partition": f"P{p.index}", "backend": p.backend, "nodes": len(p.nodes), "ops": _ops(p.ops, 99),
             "measured_ms": p.measured_ms, "latency_from": p.latency_from,
             "handoffs_in": len(p.handoffs_in), "handoff_ms": p.handoff_ms,
             "handoff_bytes": sum(h.nbytes for h in p.handoffs_in)}
            for p in self.partitions
        ]

    def title(self) -> str:
        r = self.report
        what = f"{self.plan.model}: {len(self.partitions)} partition(s) on {', '.join(self.backends)}"
        lat = r.get("plan_latency_ms", self.plan.measured_ms)
        if lat is not None:
            what += f", {lat:.3f} ms end to end"
        if r.get("chosen"):
            what += f" ({r['chosen']})"
        return what

    def table(self):
        """A rich Table: each partition's backend, ops, measured latency and incoming hand-offs."""
        from rich.markup import escape
        from rich.table import Table

        # backend names carry brackets (onnxruntime[spin=on]), which rich would read as markup
        t = Table(title=escape(self.title()), caption=escape(self._caption()))
        for col, just in (("#", "right"), ("backend", "left"), ("nodes", "right"), ("ops", "left"),
                          ("measured", "right"), ("hand-offs in", "right"), ("hand-off cost", "right")):
            t.add_column(col, justify=just)
        for p in self.partitions:
            src = " (db)" if p.latency_from == "database" else ""
            hin = f"{len(p.handoffs_in)} ({_size(sum(h.nbytes for h in p.handoffs_in))})" if p.handoffs_in else "-"
            t.add_row(f"P{p.index}", escape(p.backend), str(len(p.nodes)), escape(_ops(p.ops)),
                      _ms(p.measured_ms) + src, hin, _ms(p.handoff_ms))
        return t

    def _caption(self) -> str:
        known = [p.measured_ms for p in self.partitions]
        hand = [h.cost_ms for h in self.handoffs if h.cost_ms is not None]
        out = f"{len(self.handoffs)} hand-off(s)"
        if hand:
            out += f", {_ms(sum(hand))} measured in chains"
        if all(v is not None for v in known):
            out += f"; partitions sum to {_ms(sum(known))}"
        else:
            out += "; measured '-': never timed alone (e.g. a merged region); plans are judged end to end"
        return out

    # -- the picture ------------------------------------------------------------------------
    def dot(self):
        """The picture as a ``graphviz.Digraph`` (needs the ``graphviz`` Python package, not ``dot``)."""
        try:
            import graphviz
        except ImportError:
            raise GraphvizMissing(f"drawing the plan needs the graphviz Python package (pip install graphviz) and "
                                  f"Graphviz's dot; {INSTALL_HINT}") from None
        g = self.graph
        font = "Helvetica"
        d = graphviz.Digraph(
            name=self.plan.model,
            graph_attr={"rankdir": "TB", "fontname": font, "fontsize": "12", "label": self.title(),
                        "labelloc": "t", "nodesep": "0.25", "ranksep": "0.35", "newrank": "true"},
            node_attr={"shape": "box", "style": "rounded,filled", "fillcolor": "white", "fontname": font,
                       "fontsize": "10", "height": "0.3", "margin": "0.08,0.03"},
            edge_attr={"color": "#777777", "arrowsize": "0.6", "fontname": font, "fontsize": "8"},
        )
        ends = {t: f"in{i}" for i, t in enumerate(g.input_names)}
        ends.update({t: f"out{i}" for i, t in enumerate(g.output_names)})
        for t in g.input_names:
            info = g.tensors[t]
            d.node(ends[t], f"{t}\n{'x'.join(map(str, info.shape))}", shape="ellipse", style="dashed",
                   id=f"input-{t}")
        for t in g.output_names:
            info = g.tensors[t]
            d.node(ends[t], f"{t}\n{'x'.join(map(str, info.shape))}", shape="ellipse", style="dashed",
                   id=f"output-{t}")
        for p in self.partitions:
            with d.subgraph(name=f"cluster_P{p.index}") as c:
                label = f"P{p.index} {p.backend}  {len(p.nodes)} node(s)"
                if p.measured_ms is not None:
                    label += f"  {_ms(p.measured_ms)}"
                c.attr(id=f"partition-{p.index}", label=label, style="rounded,filled", color="#555555",
                       fillcolor=self.colours[p.backend], penwidth="1.2", fontsize="10", labeljust="l",
                       tooltip=f"P{p.index} on {p.backend}: {_ops(p.ops, 99)}")
                for n in p.nodes:
                    node = g.nodes[n]
                    shape = "x".join(map(str, g.tensors[node.outputs[0]].shape)) if node.outputs else ""
                    c.node(f"n{n}", node.op_type, id=f"node-{n}", tooltip=f"{node.name}: {node.op_type} -> {shape}")
        crossing = {(h.tensor, h.dst): h for h in self.handoffs}
        k = 0
        for n, node in enumerate(g.nodes):
            for t in dict.fromkeys(node.inputs):
                if not t or t in g.initializers:
                    continue
                src = g.producer.get(t)
                if src is None:
                    if t in g.input_names:
                        d.edge(ends[t], f"n{n}")
                    continue
                h = crossing.get((t, self.owner[n]))
                if h is None:
                    d.edge(f"n{src}", f"n{n}")
                    continue
                label = _size(h.nbytes) + ("" if h.cost_ms is None else f"\n{_ms(h.cost_ms)}")
                d.edge(f"n{src}", f"n{n}", label=label, id=f"handoff-{k}", color=HANDOFF_COLOUR,
                       fontcolor=HANDOFF_COLOUR, style="bold,dashed", penwidth="2",
                       tooltip=f"hand-off {t}: {self.partitions[h.src].backend} -> "
                               f"{self.partitions[h.dst].backend}, {_size(h.nbytes)}, {_ms(h.cost_ms)}")
                k += 1
        for t in g.output_names:
            if t in g.producer:
                d.edge(f"n{g.producer[t]}", ends[t])
        d.node("legend", label=self._legend_html(), shape="plaintext", style="", id="legend")
        return d

    def _legend_html(self) -> str:
        e = html.escape
        rows = ['<TR><TD COLSPAN="7" ALIGN="LEFT"><B>partitions</B>, in execution order</TD></TR>',
                "<TR><TD></TD><TD>backend</TD><TD>nodes</TD><TD>ops</TD><TD>measured</TD><TD>hand-offs in</TD>"
                "<TD>hand-off cost</TD></TR>"]
        for p in self.partitions:
            src = " (db)" if p.latency_from == "database" else ""
            hin = f"{len(p.handoffs_in)}, {_size(sum(h.nbytes for h in p.handoffs_in))}" if p.handoffs_in else "-"
            rows.append(
                f'<TR><TD BGCOLOR="{self.colours[p.backend]}">P{p.index}</TD><TD ALIGN="LEFT">{e(p.backend)}</TD>'
                f'<TD>{len(p.nodes)}</TD><TD ALIGN="LEFT">{e(_ops(p.ops))}</TD><TD>{e(_ms(p.measured_ms) + src)}</TD>'
                f"<TD>{e(hin)}</TD><TD>{e(_ms(p.handoff_ms))}</TD></TR>"
            )
        rows.append(f'<TR><TD COLSPAN="7" ALIGN="LEFT"><FONT COLOR="{HANDOFF_COLOUR}">- - &gt;</FONT> hand-off: '
                    f"tensor size and its measured cost (per backend pair, in executed chains)</TD></TR>")
        rows.append(f'<TR><TD COLSPAN="7" ALIGN="LEFT">{e(self._caption())}</TD></TR>')
        return '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(rows) + "</TABLE>>"

    def svg(self) -> str:
        """The picture as SVG text (GraphvizMissing when ``dot`` is not installed)."""
        d = self.dot()
        if shutil.which("dot") is None:
            raise GraphvizMissing(f"drawing the plan needs Graphviz's dot, which is not on PATH; {INSTALL_HINT}")
        import graphviz

        try:
            return d.pipe(format="svg", encoding="utf-8")
        except graphviz.ExecutableNotFound:
            raise GraphvizMissing(f"drawing the plan needs Graphviz's dot, which is not on PATH; {INSTALL_HINT}") from None
        except graphviz.CalledProcessError as e:
            raise CollageError(f"Graphviz's dot failed on the plan: {(e.stderr or b'').decode(errors='replace').strip()}") from None

    def write_svg(self, path: str | Path) -> Path:
        """Writes the SVG (a browser opens it); returns its path."""
        text = self.svg()
        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        except OSError as e:
            raise CollageError(f"cannot write the picture to {p}: {e.strerror or e}") from None
        return p


__all__ = ["COLOURS", "GraphvizMissing", "Handoff", "PartitionView", "PlanView", "read_placed"]
