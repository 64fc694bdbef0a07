"""The probe set: fixed reference subgraphs whose latencies describe a machine and a backend.

Every machine collage-ml runs on is one its shipped cost model has never seen.
The probe set is what the model can learn the machine from (the HELP approach:
a hardware embedding made of the latencies of a few fixed reference kernels).
It covers the kernel kinds the zoo is made of — 3x3, 1x1, depthwise and
transposed convolutions, MatMuls of three shapes, an elementwise chain, a
global pool, a reduction, LayerNorm, max-pooling and an attention block — each
at batch 1 and 16 (:data:`PROBE_SET_VERSION`: 24 probes). The models are built
in code from a fixed seed, so the set is the same on every machine.

:func:`ensure_probes` measures the probes once per (hardware fingerprint,
backend, backend version, protocol) under the current measurement protocol,
through the ordinary :class:`~collage_ml.measure.runner.Runner` (so every probe
is also an ordinary, checked measurement), and records the results in the
database's ``probes`` table, from which later runs reuse them. Everything the
model predicts on a machine is read through these results, so a calibration
measures the set, measures a third of it again, and checks the two against each
other (the rest of the second pass and a third one where a backend's disagree,
:data:`AGREE`, :data:`CHECK_EVERY`).
:func:`recalibrate` measures them again once they are old, as a calibration of
that sitting (``collect`` calls it before each source), since these machines'
speed moves by several percent over hours. ``collage-ml calibrate`` runs it
on its own.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from collage_ml.measure.hardware import node_id
from collage_ml.ui import Bar

#: bump when a probe changes: results of another probe-set version are never mixed in
PROBE_SET_VERSION = 1
PROBE_FAMILY = "probe"
BATCHES = (1, 16)


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    build: Callable[[int, np.random.Generator], "object"]  # (batch, rng) -> onnx.ModelProto


def _model(nodes, inputs, outputs, inits=(), opset: int = 17):
    from onnx import helper

    g = helper.make_graph(nodes, "probe", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _f(name, shape):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _w(rng, name, shape, scale=0.05):
    from onnx import numpy_helper

    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _conv(cin, cout, hw, k, group=1, stride=1):
    def build(b, rng):
        from onnx import helper

        pad = k // 2
        out_hw = (hw + 2 * pad - k) // stride + 1
        n = helper.make_node("Conv", ["x", "W", "B"], ["y"], kernel_shape=[k, k], pads=[pad] * 4,
                             strides=[stride, stride], group=group)
        return _model([n], [_f("x", (b, cin, hw, hw))], [_f("y", (b, cout, out_hw, out_hw))],
                      [_w(rng, "W", (cout, cin // group, k, k)), _w(rng, "B", (cout,))])

    return build


def _conv_transpose(cin, cout, hw):
    def build(b, rng):
        from onnx import helper

        n = helper.make_node("ConvTranspose", ["x", "W"], ["y"], kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
        return _model([n], [_f("x", (b, cin, hw, hw))], [_f("y", (b, cout, 2 * hw, 2 * hw))],
                      [_w(rng, "W", (cin, cout, 4, 4))])

    return build


def _matmul(m, k, n):
    def build(b, rng):
        from onnx import helper

        nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["y"])]
        return _model(nodes, [_f("x", (b, m, k))], [_f("y", (b, m, n))], [_w(rng, "W", (k, n)), _w(rng, "B", (n,))])

    return build


def _elementwise(b, rng):
    from onnx import helper

    shape = (b, 64, 56, 56)
    nodes = [
        helper.make_node("Mul", ["x", "S"], ["a"]),
        helper.make_node("Add", ["a", "B"], ["c"]),
        helper.make_node("Relu", ["c"], ["d"]),
        helper.make_node("Sigmoid", ["d"], ["y"]),
    ]
    return _model(nodes, [_f("x", shape)], [_f("y", shape)], [_w(rng, "S", (64, 1, 1), 1.0), _w(rng, "B", (64, 1, 1))])


def _global_pool(b, rng):
    from onnx import helper

    n = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    return _model([n], [_f("x", (b, 512, 14, 14))], [_f("y", (b, 512, 1, 1))])


def _reduce(b, rng):
    from onnx import helper, numpy_helper

    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    n = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)
    return _model([n], [_f("x", (b, 256, 512))], [_f("y", (b, 256, 1))], [axes], opset=18)


def _layernorm(b, rng):
    from onnx import helper

    n = helper.make_node("LayerNormalization", ["x", "G", "B"], ["y"], axis=-1, epsilon=1e-5)
    return _model([n], [_f("x", (b, 128, 256))], [_f("y", (b, 128, 256))],
                  [_w(rng, "G", (256,), 1.0), _w(rng, "B", (256,))])


def _maxpool(b, rng):
    from onnx import helper

    n = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return _model([n], [_f("x", (b, 64, 56, 56))], [_f("y", (b, 64, 28, 28))])


def _attention(b, rng):
    from onnx import helper

    heads, seq, d = 4, 64, 32
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    from onnx import numpy_helper

    scale = numpy_helper.from_array(np.array(1.0 / np.sqrt(d), np.float32), "scale")
    return _model(
        nodes,
        [_f("q", (b, heads, seq, d)), _f("kt", (b, heads, d, seq)), _f("v", (b, heads, seq, d))],
        [_f("y", (b, heads, seq, d))],
        [scale],
    )


PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("conv3x3-64x28", _conv(64, 64, 28, 3)),
    ProbeSpec("conv1x1-256to64x28", _conv(256, 64, 28, 1)),
    ProbeSpec("dwconv3x3-128x28", _conv(128, 128, 28, 3, group=128)),
    ProbeSpec("convT4x4s2-64to32x16", _conv_transpose(64, 32, 16)),
    ProbeSpec("matmul-64x256x256", _matmul(64, 256, 256)),
    ProbeSpec("matmul-1x512x2048", _matmul(1, 512, 2048)),
    ProbeSpec("matmul-128x64x64", _matmul(128, 64, 64)),
    ProbeSpec("elementwise-64x56", _elementwise),
    ProbeSpec("globalpool-512x14", _global_pool),
    ProbeSpec("reducemean-256x512", _reduce),
    ProbeSpec("layernorm-128x256", _layernorm),
    ProbeSpec("maxpool3x3s2-64x56", _maxpool),
    ProbeSpec("attention-4x64x32", _attention),
)


#: every probe of this probe-set version, fixed at import: the featurizer's probe columns (tests that measure a
#: subset, by replacing :data:`PROBES`, leave the other columns missing, never shorter rows)
PROBE_COLUMNS: tuple[str, ...] = tuple(f"{p.name}@b{b}" for p in PROBES for b in BATCHES)


def probe_names() -> list[str]:
    """Every probe's name, ``<kernel>@b<batch>``, in the set's order."""
    return [f"{p.name}@b{b}" for p in PROBES for b in BATCHES]


def probe_graphs() -> list[tuple[str, "object"]]:
    """(name, Graph) for every probe; deterministic (each probe's weights come from its own seed)."""
    from collage_ml.ir.importers import from_onnx

    out = []
    for i, p in enumerate(PROBES):
        for b in BATCHES:
            rng = np.random.default_rng(1000 + 17 * i + b)
            out.append((f"{p.name}@b{b}", from_onnx(p.build(b, rng), name=f"probe-{p.name}-b{b}")))
    return out


#: a calibration measures the probe set twice; a backend whose two passes differ by more than this factor at the
#: median over its probes is measured a third time, and each probe keeps the median of its three. On the Zen 4
#: (2026-12-06, 04:04 UTC) one sitting read OpenVINO's probes 1.2-4.8x (median 1.6x) and ONNX Runtime's 1.2x
#: slower than the machine's other sittings, though no row of it was flagged contended; the model, reading the
#: machine through them, then ranked OpenVINO last on nasrnn and mobilenetv2, where it is the fastest.
AGREE = 1.10
PASSES = 2  # a calibration's passes before the check (1: no check, as before 2026-12-06)
#: the check's second pass measures every CHECK_EVERY-th probe of the set (1: every probe, as on 2026-12-06),
#: and the rest of it only where a backend's check fails. The outliers it is for move a whole backend's probes
#: for seconds (the Zen 4's OpenVINO: every probe, median 1.6x), which a third of them shows as well as all
#: of them; and two full passes agree no better between calibrations than one (the Zen 4, five of each:
#: benchmarks/results/calibration_passes_zen4.json), so the full second pass bought insurance, not precision.
CHECK_EVERY = 3


def pass_ratios(first: dict, second: dict) -> dict[str, float]:
    """{backend: median over its probes of second / first} for the probes both passes measured (keys
    ``(backend, probe)``, values seconds or None)."""
    by: dict[str, list[float]] = {}
    for k, a in first.items():
        b = second.get(k)
        if a and b:
            by.setdefault(k[0], []).append(b / a)
    return {name: float(np.median(v)) for name, v in by.items()}


def combined(values: Sequence[float | None]) -> float | None:
    """One probe's result from its passes: the geometric mean of two, the median of three or more (the valid
    ones; None when no pass ran it)."""
    ok = sorted(v for v in values if v)
    if not ok:
        return None
    if len(ok) == 2:
        return float(np.sqrt(ok[0] * ok[1]))
    return float(np.median(ok))


def _nth(n: int) -> str:
    return {1: "st", 2: "nd", 3: "rd"}.get(n if n < 20 else n % 10, "th")


def ensure_probes(
    runner, backends: Sequence, progress: bool = False, say: Callable[[str], None] | None = None,
    sitting: float | None = None,
) -> dict[str, dict[str, float | None]]:
    """{backend name: {probe name: seconds, or None where the backend cannot run it}} on the runner's machine.

    Reads the runner's database first; measures only what is missing (all of it on a machine and backend
    the database has not seen), under the runner's protocol, and records it. Without a database it
    measures every time. With ``sitting`` (when a later calibration started) it measures every probe again,
    past the database's cache, and records the results as that sitting's calibration.

    A calibration is :data:`PASSES` passes over the missing probes, the second over every
    :data:`CHECK_EVERY`-th of them, checked against each other (see :data:`AGREE`); each probe records the
    geometric mean of its two passes (its one, where the second skipped it), or, for a backend whose passes
    disagree, the median of three whole passes. The
    first pass of a first calibration goes through the measurement cache, so an interrupted one is resumed
    from its rows; the later passes are measured now, and the results are recorded once every pass is done.
    """
    from collage_ml.candidates import Candidate

    db = runner.db
    names = probe_names()
    out: dict[str, dict[str, float | None]] = {}
    todo = []
    for b in backends:
        have = {} if db is None or sitting is not None else db.probes(
            runner.hardware, b.name, b.version, runner.timing.name, PROBE_SET_VERSION)
        out[b.name] = dict(have)
        if any(n not in have for n in names):
            todo.append(b)
    if not todo:
        return out
    if say and sitting is None:  # a later sitting is announced by its caller (``recalibrate``)
        say(f"measuring the probe set on {', '.join(b.name for b in todo)} (once per machine and backend)")
    graphs = probe_graphs()
    refs = {id(g): g.reference(seed=0) for _, g in graphs}
    cands, label, subgraph = [], {}, {}
    for b in todo:
        for name, g in graphs:
            if name in out[b.name]:
                continue
            subgraph[(b.name, name)] = (b, g.whole())
            if all(b.supports(g, n) for n in g.nodes):
                c = Candidate(g.whole(), b, f"probe:{name}")
                cands.append(c)
                label[c.key] = (b.name, name)
    unsupported = [k for k in subgraph if k not in set(label.values())]
    passes = max(1, int(PASSES))
    bar = Bar(progress, transient=True).start().task("probes", len(cands))

    def measure_pass(batch: list, cached: bool) -> dict:
        got: dict = {}

        def on_result(c, m, _cached) -> None:
            got[label[c.key]] = m.median if m.valid else None
            bar.step()

        # every missing probe of every backend in one call, so the protocol's passes spread each probe's windows
        # over the whole set (one at a time, a probe's windows would run back to back); the runner still
        # measures one backend per phase, or interleaves their passes where the protocol says so
        with nullcontext() if cached else runner.detached():
            runner.measure(batch, lambda c: refs[id(c.subgraph.graph)], family=PROBE_FAMILY, on_result=on_result)
        return got

    ratios: dict[str, float] = {}
    off: dict[str, float] = {}
    every = max(1, int(CHECK_EVERY))
    sample = [c for c in cands if names.index(label[c.key][1]) % every == 0]
    planned = len(cands) + (len(sample) + len(cands) * (passes - 2) if passes >= 2 else 0)
    bar.set_total(planned)
    try:
        results = [measure_pass(cands, cached=sitting is None)]
        for k in range(passes - 1):
            results.append(measure_pass(sample if k == 0 else cands, cached=False))
        if passes >= 2 and cands:
            ratios = pass_ratios(results[0], results[1])
            off = {b: r for b, r in ratios.items() if abs(np.log(r)) > np.log(AGREE)}
            if say:
                which = "second pass" if every == 1 else f"second pass (every {every}{_nth(every)} probe)"
                say(f"the probe set's {which} / its first (median over each backend's probes): "
                    + ", ".join(f"{b} {r:.2f}" for b, r in ratios.items())
                    + (f"; {', '.join(off)} off by over {AGREE - 1:.0%}: measuring "
                       f"{'it' if len(off) == 1 else 'them'} a third time, each probe keeping the median of three"
                       if off else ""))
            if off:
                again = [c for c in cands if label[c.key][0] in off]
                rest = [c for c in again if label[c.key] not in results[1]] if passes == 2 else []
                bar.set_total(planned + len(rest) + len(again))
                if rest:  # the second pass, whole, for the backends it flagged
                    results[1].update(measure_pass(rest, cached=False))
                results.append(measure_pass(again, cached=False))
    finally:
        bar.close()
    # whole: an interrupted calibration records nothing (a first one is resumed from its first pass's rows)
    final = {k: combined([r[k] for r in results if k in r]) for k in label.values()}
    final.update({k: None for k in unsupported})
    node = node_id()
    for (bname, name), value in final.items():
        out[bname][name] = value
        if db is not None:
            b, sg = subgraph[(bname, name)]
            db.commit_probe(runner.hardware, b.name, b.version, runner.timing.name, PROBE_SET_VERSION, name, value,
                            sg.hash, sitting=sitting, node=node)
    if db is not None:
        for b in todo:
            if any(label[c.key][0] == b.name for c in cands):
                db.commit_probe_check(runner.hardware, b.name, b.version, runner.timing.name, PROBE_SET_VERSION,
                                      passes + (b.name in off), ratios.get(b.name), node=node)
    return out


def recalibrate(
    runner, backends: Sequence, max_age: float | None, progress: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Brings the calibration of the runner's machine in its database up to date, and returns what it
    measured: {backend name: "first" or "again"}.

    A backend the database has never calibrated on this machine (and protocol) gets its first calibration
    (:func:`ensure_probes`); one whose newest calibration is older than ``max_age`` seconds (None: never
    again) is measured again, as a sitting of its own. The machine's speed moves by several percent over
    hours on the VMs measured, and a row is read against the calibration of its own sitting
    (``models.dataset``): over fifteen pairs of six sittings of the Xeon, that turned 83.7% of labels within
    ±10% of the other sitting's into 87.2%, and 61.8% into 78.3% where the machine moved most
    (datasets/README.md, "Reruns").

    With ``max_age``, calibrations that name another node (``measure.hardware.node_id``: another VM of this
    kind, or this one before a reboot) do not count as this machine's: a database brought from another
    machine is calibrated again here. Calibrations that name no node (recorded before nodes were) count."""
    db = runner.db
    if db is None:
        raise ValueError("recalibrate needs a runner with a database to keep the calibration in")
    names, now, me = probe_names(), time.time(), node_id()
    first, again, elsewhere, oldest = [], [], [], 0.0
    for b in backends:
        key = (runner.hardware, b.name, b.version, runner.timing.name, PROBE_SET_VERSION)
        if any(n not in db.probes(*key) for n in names):
            first.append(b)
        elif max_age is not None:
            here = [c for c in db.calibrations(runner.hardware, PROBE_SET_VERSION, b.name, b.version,
                                               runner.timing.name) if c.node in (None, me)]
            if not here:
                elsewhere.append(b)
            elif now - here[-1].time > max_age:
                again.append(b)
                oldest = max(oldest, now - here[-1].time)
    if first:
        ensure_probes(runner, first, progress=progress, say=say)
    if again or elsewhere:
        # one sitting, every backend: a first calibration ends seconds apart per backend, so the backends fall
        # due a source apart, and were calibrated in two sittings minutes apart, each beside other backends'
        # passes than the first time (measured on the Zen 4: ONNX Runtime and Inductor calibrated alone read
        # as they do beside all four, 1.01 / 0.98-1.01, so this is about one sitting's bookkeeping, not bias)
        skip = {b.name for b in first + again + elsewhere}
        also = [b for b in backends if b.name not in skip]
        if say and again:
            say(f"calibrating {', '.join(b.name for b in again)} again: the newest calibration of this machine is "
                f"{oldest / 3600:.1f} h old (rows are read against the calibration of their own sitting)")
        if say and elsewhere:
            say(f"calibrating {', '.join(b.name for b in elsewhere)} on this machine: the database's calibrations "
                "were measured on another machine of this kind (or before a reboot)")
        if say and also:
            say(f"calibrating {', '.join(b.name for b in also)} with them: one sitting, every backend together")
        again += elsewhere + also
        ensure_probes(runner, again, progress=progress, say=say, sitting=time.time())
    return {**{b.name: "first" for b in first}, **{b.name: "again" for b in again}}


def probe_drift(runner, backends: Sequence, db, progress: bool = False) -> dict:
    """How far the machine has moved since ``db``'s newest calibration: the probe set measured again now with
    ``runner`` (which should have no database, so nothing is stored or read from a cache), against the
    results ``db`` holds for the runner's machine and protocol.

    Returns {"backends": {name: {"calibrated_at", "ratio", "probes"}}, "ratio"}: per backend the median over
    its probes of now / stored, and that median over every backend's probes together (below 1: faster now).
    A backend the database never calibrated here is left out; none at all raises a CollageError.
    """
    from collage_ml.errors import CollageError

    stored = {b.name: db.probes(runner.hardware, b.name, b.version, runner.timing.name, PROBE_SET_VERSION)
              for b in backends}
    have = [b for b in backends if any(v for v in stored[b.name].values())]
    if not have:
        raise CollageError(
            f"{db.path} holds no probe results of this machine ({runner.hardware}, protocol {runner.timing.name}) "
            f"for {', '.join(b.name for b in backends)}; run `collage-ml calibrate --db {db.path}` first")
    now = ensure_probes(runner, have, progress=progress)
    out, every = {}, []
    for b in have:
        ratios = [now[b.name][n] / v for n, v in stored[b.name].items() if v and now[b.name].get(n)]
        every += ratios
        out[b.name] = {"calibrated_at": db.probe_time(runner.hardware, b.name, b.version, runner.timing.name,
                                                      PROBE_SET_VERSION),
                       "ratio": float(np.median(ratios)) if ratios else None, "probes": len(ratios)}
    return {"backends": out, "ratio": float(np.median(every)) if every else None}
