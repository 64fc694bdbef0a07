"""End-to-end measurement of a compiled plan, in a worker process.

The plan is compiled into a PlacedModel inside the worker, run on the
reference inputs, checked against the reference outputs, and timed by the
same rules as candidates. A plan that fails to compile or gives wrong numbers
is invalid, with its error text. The timing follows the measurement protocol's
per-process rules (``measure.timing``); the tuner times every plan once, and a
second time in the opposite order only where more plans are close than a
head-to-head holds (``search/judging.py``).

:class:`HeadToHeadTask` (:func:`measure_head_to_head`) settles a close contest: it compiles two or three
plans in one worker and alternates short windows of each, ABAB..., so that every plan runs in the same
minutes. A slow period of the host (docs/results/noise.md: such states last about 2 s) then slows every plan
alike instead of deciding which one wins; each plan's latency is the median of its windows. A contest that is
clear after three rounds (every other plan more than 10% behind the leader in each round) stops there.

Every run is kept: :func:`measure_plan` adds it to the plan's record in the
runner's database (``plan_timings``, keyed by the plan's hash; see
``measure.records``), so each plan the tuner or the graph-level search judges
end to end is there for the cost model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from collage_ml.errors import describe
from collage_ml.measure.records import record_plan_timing
from collage_ml.measure.timing import Tolerance, TimingConfig


def _compile_and_check(model_bytes: bytes, plan_json: str, feeds, expected, threads: int, tolerance: Tolerance):
    """Compiles a plan in this worker and checks its outputs against the reference: (the placed model, its
    result fields so far), or (None, the invalid result) when the numbers are wrong. Errors raise."""
    import onnx

    from collage_ml.backends.base import to_numpy
    from collage_ml.ir.importers import from_onnx
    from collage_ml.measure.timing import compare
    from collage_ml.plan import Plan

    plan = Plan.from_json(plan_json, trusted=True)  # written by this run's parent, not a file
    graph = from_onnx(onnx.load_from_string(model_bytes), name=plan.model)
    t0 = time.perf_counter()
    pm = plan.compile(graph, threads=threads)
    compile_seconds = time.perf_counter() - t0
    out = pm.run(feeds)
    names = list(pm.output_names)
    cmp = compare([to_numpy(out[n]) for n in names], expected, names, tolerance)
    if not cmp.ok:
        return None, {"valid": False, "error_text": f"wrong numbers: {cmp.detail}", "max_abs_error": cmp.max_abs}
    return pm, {"valid": True, "max_abs_error": cmp.max_abs, "compile_seconds": compile_seconds,
                "partitions": len(pm.plan.partitions)}


@dataclass
class PlanTask:
    model_bytes: bytes
    plan_json: str
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    threads: int
    timing: TimingConfig = field(default_factory=TimingConfig)
    tolerance: Tolerance = field(default_factory=Tolerance)

    def execute(self) -> dict:
        from collage_ml.measure.tasks import timing_fields
        from collage_ml.measure.timing import time_callable

        try:
            pm, checked = _compile_and_check(self.model_bytes, self.plan_json, self.feeds, self.expected,
                                             self.threads, self.tolerance)
            if pm is None:
                return checked
            res = time_callable(lambda: pm.run(self.feeds), self.timing)
            return {**checked, **timing_fields(res)}
        except Exception as e:
            return {"valid": False, "error_text": describe(e)}


#: whole-model timings keep windows of up to 0.3 s (``m2``'s): under ``m3``'s 0.1 s a 50 ms model would get
#: three samples per window
PLAN_TIME_CAP = 0.3


def _plan_io(graph, reference) -> tuple[dict, dict]:
    """A whole-model plan's inputs and its expected outputs, from the reference activations."""
    return ({n: reference[n] for n in graph.input_names}, {n: reference[n] for n in graph.output_names})


def measure_plan(runner, graph, plan, reference, process: int = 0) -> dict:
    """Measures ``plan`` end to end in the runner's worker number ``process``; returns the result dict,
    and records the run in the runner's database (when it has one).

    The tuner's second round, where there is one, uses another process, so the best of its rounds is a
    minimum over processes, as the protocol asks."""
    feeds, expected = _plan_io(graph, reference)
    timing = replace(runner.timing, time_cap=max(runner.timing.time_cap, PLAN_TIME_CAP))
    task = PlanTask(graph.model.SerializeToString(), plan.to_json(specs=True), feeds, expected, runner.threads,
                    timing, runner.tolerance)
    backends = [p.resolve_backend() for p in plan.partitions]
    worker = runner.worker_for(backends, process)
    result = worker.run(task, runner.timeout * 4)
    record_plan_timing(runner, graph, plan, backends, result, process)
    return result


#: a head-to-head gives each plan this many windows, alternating plans window by window (ABAB, then BABA)
HEAD_TO_HEAD_ROUNDS = 8
#: each window runs its plan for this long, and at least HEAD_TO_HEAD_MIN_CALLS calls
HEAD_TO_HEAD_WINDOW_S = 0.15
HEAD_TO_HEAD_MIN_CALLS = 3
#: the contest stops after this many rounds once it is decided: every other plan slower than the leader by more
#: than HEAD_TO_HEAD_CLEAR in every round so far (each round's windows are next to each other in time)
HEAD_TO_HEAD_MIN_ROUNDS = 3
HEAD_TO_HEAD_CLEAR = 0.10


def decided(windows: list[list[float]], clear: float = HEAD_TO_HEAD_CLEAR) -> bool:
    """Whether a head-to-head whose plans have these windows (one list per plan, round by round) is decided:
    the plan of the lowest median window leads, and every other plan was slower than it by more than ``clear``
    in each round."""
    if len(windows) < 2:
        return True
    lead = min(range(len(windows)), key=lambda i: float(np.median(windows[i])))
    return all(w > (1 + clear) * lw for i, ws in enumerate(windows) if i != lead
               for w, lw in zip(ws, windows[lead]))


def _window(fn, seconds: float, min_calls: int, max_calls: int) -> float:
    """The median per-call time of ``fn`` over one window: ``seconds`` long or ``max_calls`` calls, whichever
    comes first, and at least ``min_calls`` calls."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or (time.perf_counter() - start < seconds and len(times) < max_calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


@dataclass
class HeadToHeadTask:
    """Compiles and checks each plan, then times them alternately in this one process (module docstring).

    The result has ``plans``: one result per plan, in order (``valid``, ``median``: the median of its
    windows, ``samples``: each window's median per-call time, ``compile_seconds``; or ``error_text``)."""

    model_bytes: bytes
    plan_jsons: list[str]
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    threads: int
    #: the protocol's window bounds the calls: at most ``max_repeats`` samples of ``calls_per_sample`` calls
    timing: TimingConfig = field(default_factory=TimingConfig)
    tolerance: Tolerance = field(default_factory=Tolerance)
    rounds: int = HEAD_TO_HEAD_ROUNDS
    window_s: float = HEAD_TO_HEAD_WINDOW_S
    #: stop after this many rounds once the contest is decided (:func:`decided`)
    min_rounds: int = HEAD_TO_HEAD_MIN_ROUNDS

    def execute(self) -> dict:
        from collage_ml.measure.timing import calls_per_sample, spread_of

        out: list[dict] = []
        runs: dict[int, object] = {}
        for i, pj in enumerate(self.plan_jsons):
            try:
                pm, checked = _compile_and_check(self.model_bytes, pj, self.feeds, self.expected, self.threads,
                                                 self.tolerance)
            except Exception as e:
                checked, pm = {"valid": False, "error_text": describe(e)}, None
            if pm is not None:
                runs[i] = (lambda pm=pm: pm.run(self.feeds))
                checked["samples"] = []
            out.append(checked)
        order = list(runs)
        most: dict[int, int] = {}
        started = time.time()
        try:
            for i in order:  # warm every plan before the first timed window
                one = _window(runs[i], self.window_s, HEAD_TO_HEAD_MIN_CALLS, HEAD_TO_HEAD_MIN_CALLS)
                most[i] = self.timing.max_repeats * calls_per_sample(one, self.timing)
                _window(runs[i], self.window_s, HEAD_TO_HEAD_MIN_CALLS, most[i])
            for r in range(self.rounds):
                for i in (order if r % 2 == 0 else order[::-1]):
                    if len(order) > 1:  # untimed: the last plan's runtime threads spin on for a while
                        _window(runs[i], self.timing.switch_warmup, 1, most[i])
                    out[i]["samples"].append(_window(runs[i], self.window_s, HEAD_TO_HEAD_MIN_CALLS, most[i]))
                if r + 1 >= self.min_rounds and decided([out[i]["samples"] for i in order]):
                    break
        except Exception as e:  # a plan that ran once and then raised: no timing of this contest counts
            return {"plans": [{"valid": False, "error_text": describe(e)} for _ in out]}
        for i in order:
            w = out[i]["samples"]
            out[i].update(median=float(np.median(w)), spread=spread_of(w), method="head-to-head", started=started)
        return {"plans": out}


def measure_head_to_head(runner, graph, plans: dict, reference, process: int = 0) -> dict[str, dict]:
    """Times ``plans`` (label -> Plan) alternately in the runner's worker number ``process``
    (:class:`HeadToHeadTask`); returns label -> result, and records each plan's run in the runner's
    database (when it has one), as :func:`measure_plan` does."""
    labels = list(plans)
    feeds, expected = _plan_io(graph, reference)
    task = HeadToHeadTask(graph.model.SerializeToString(), [plans[k].to_json(specs=True) for k in labels], feeds,
                          expected, runner.threads, runner.timing, runner.tolerance)
    backends = {k: [p.resolve_backend() for p in plans[k].partitions] for k in labels}
    union = list({b.name: b for bs in backends.values() for b in bs}.values())
    worker = runner.worker_for(union, process)
    res = worker.run(task, runner.timeout * 4 * len(labels))
    per = res.get("plans")
    if not isinstance(per, list) or len(per) != len(labels):  # the worker failed as a whole
        per = [dict(res, valid=False) for _ in labels]
    out = {}
    for k, r in zip(labels, per):
        record_plan_timing(runner, graph, plans[k], backends[k], r, process)
        out[k] = r
    return out
