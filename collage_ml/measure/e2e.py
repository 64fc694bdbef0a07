"""End-to-end measurement of a compiled plan, in a worker process.

The plan is compiled into a PlacedModel inside the worker, run on the
reference inputs, checked against the reference outputs, and timed by the
same rules as candidates. A plan that fails to compile or gives wrong numbers
is invalid, with its error text. The timing follows the measurement protocol's
per-process rules (``measure.timing``); the tuner times the plans it compares
in two rounds, in opposite orders.

Every run is kept: :func:`measure_plan` adds it to the plan's record in the
runner's database (``plan_timings``, keyed by the plan's hash; see
``measure.records``), so each plan the tuner or the graph-level search judges
end to end is there for the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from collage_ml.errors import describe
from collage_ml.measure.records import record_plan_timing
from collage_ml.measure.timing import Tolerance, TimingConfig


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
        import time

        import onnx

        from collage_ml.backends.base import to_numpy
        from collage_ml.ir.importers import from_onnx
        from collage_ml.measure.timing import compare, time_callable
        from collage_ml.plan import Plan

        try:
            plan = Plan.from_json(self.plan_json, trusted=True)  # written by this run's parent, not a file
            graph = from_onnx(onnx.load_from_string(self.model_bytes), name=plan.model)
            t0 = time.perf_counter()
            pm = plan.compile(graph, threads=self.threads)
            compile_seconds = time.perf_counter() - t0
            out = pm.run(self.feeds)
            names = list(pm.output_names)
            cmp = compare([to_numpy(out[n]) for n in names], self.expected, names, self.tolerance)
            if not cmp.ok:
                return {"valid": False, "error_text": f"wrong numbers: {cmp.detail}", "max_abs_error": cmp.max_abs}
            res = time_callable(lambda: pm.run(self.feeds), self.timing)
            from collage_ml.measure.tasks import timing_fields

            return {
                "valid": True, "max_abs_error": cmp.max_abs, "compile_seconds": compile_seconds,
                "partitions": len(pm.plan.partitions), **timing_fields(res),
            }
        except Exception as e:
            return {"valid": False, "error_text": describe(e)}


#: whole-model timings keep windows of up to 0.3 s (``m2``'s): under ``m3``'s 0.1 s a 50 ms model would get
#: three samples per window
PLAN_TIME_CAP = 0.3


def measure_plan(runner, graph, plan, reference, process: int = 0) -> dict:
    """Measures ``plan`` end to end in the runner's worker number ``process``; returns the result dict,
    and records the run in the runner's database (when it has one).

    The tuner's second round uses another process, so the best of its rounds is a minimum over processes,
    as the protocol asks."""
    feeds = {n: reference[n] for n in graph.input_names}
    expected = {n: reference[n] for n in graph.output_names}
    timing = replace(runner.timing, time_cap=max(runner.timing.time_cap, PLAN_TIME_CAP))
    task = PlanTask(graph.model.SerializeToString(), plan.to_json(specs=True), feeds, expected, runner.threads,
                    timing, runner.tolerance)
    backends = [p.resolve_backend() for p in plan.partitions]
    worker = runner.worker_for(backends, process)
    result = worker.run(task, runner.timeout * 4)
    record_plan_timing(runner, graph, plan, backends, result, process)
    return result
