"""Judging plans end to end: which of the plans a placement found is kept.

Every plan (the op-level DP's, each backend for the whole model, the graph-level search's best) is compiled
and timed end to end through the same executor, in its own worker process, and in a second round in the
opposite order where more plans are close than a head-to-head holds (:func:`measure_plans_e2e`). The plans
that could still win are then timed again head to head,
alternately in one process (:func:`settle_close_contest`), and the fastest of those is kept, unless it has
several partitions and does not beat the fastest one-partition plan by the margin (:func:`choose_plan`).
README, "Search" (judging), has the measurements behind each margin.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from collage_ml.measure.e2e import measure_plan
from collage_ml.plan import Plan


#: a plan slower than the first round's best by more than this fraction is not measured again in round two.
#: It was 0.10, on the belief that plan latencies repeat within a few percent; on the 2-vCPU VMs they do not in
#: a slow period: in an exhaustive placement of resnext50 on the Zen 5 (family 26 model 2, 2026-12-01 19:30 UTC,
#: ``benchmarks/guided_vs_exhaustive.py --session``) all-OpenVINO read more than 10% behind all-ONNX Runtime
#: (28.3 ms) in round one, was never timed again, and the plan kept re-timed at 26.1 ms against OpenVINO's
#: 21.3 ms. Slow periods there shift everything timed in them by up to about 30% (docs/results/noise.md).
SECOND_ROUND_MARGIN = 0.35
#: a plan of several partitions wins only if it is faster end to end than the best one-partition plan by more than
#: this fraction. End-to-end timings of sub-millisecond plans move by more than the gains they are asked to
#: tell apart: on the Zen 5 (family 26 model 2, 2026-12-01) dcgan's all-OpenVINO plan read 0.904 and 1.033 ms in
#: the two processes of one guided run, and a two-backend plan that read 0.879 ms there (2.8% ahead) re-measured
#: at 0.942 ms against all-OpenVINO's 0.795 ms (``benchmarks/guided_vs_exhaustive.py --session``). A mixed plan
#: pays hand-offs and a more fragile deployment; without a margin, noise alone picks it.
MIXED_PLAN_MARGIN = 0.05


def choose_plan(valid: Mapping[str, dict], plans: Mapping[str, Plan], margin: float = MIXED_PLAN_MARGIN) -> str:
    """The label of the plan to keep among ``valid`` (label -> end-to-end result): the fastest, unless it has
    several partitions and is not faster than the fastest one-partition plan by more than ``margin``."""
    best = min(valid, key=lambda k: valid[k]["median"])
    if len(plans[best].partitions) <= 1:
        return best
    singles = [k for k in valid if len(plans[k].partitions) == 1]
    if not singles:
        return best
    single = min(singles, key=lambda k: valid[k]["median"])
    return best if valid[best]["median"] < valid[single]["median"] * (1.0 - margin) else single


#: plans within this factor of the fastest (end to end, or a reused whole-model timing) are timed again head to
#: head (:func:`settle_close_contest`); at most HEAD_TO_HEAD_MAX of them, fastest first
HEAD_TO_HEAD_MARGIN = SECOND_ROUND_MARGIN
#: the same for a plan whose timing is its whole-model candidate's native one (guided mode reuses those): its
#: windows were taken back to back, seconds apart at most, so one slow period of the host covers them all. On the
#: Zen 5 (family 26 model 2, 2026-12-02 08:30 UTC) a guided resnet50 read all-OpenVINO at 36.3 ms in all three
#: windows and ONNX Runtime at 21.8 ms; exhaustive's windows, minutes apart, read OpenVINO at 20.6 ms
HEAD_TO_HEAD_REUSED_MARGIN = 1.0
HEAD_TO_HEAD_MAX = 3
#: the ``source`` of a result that is a whole-model candidate's native timing, reused as its plan's (guided mode)
REUSED_SOURCE = "whole-model candidate"


def settle_close_contest(valid: dict[str, dict], plans: Mapping[str, Plan], duel: Callable[[dict], dict],
                         say: Callable[[str], None] = lambda s: None,
                         margin: float | None = None, most: int | None = None) -> dict | None:
    """Times the plans that could still win again, alternately in one process, and keeps only them in the race.

    The plans' timings so far came from separate windows, seconds or minutes apart (and in guided mode a
    whole-model plan may carry its candidate's native timing), so a slow period of the host during one of
    them decides a close contest: on the Zen 5 (family 26 model 2, 2026-12-02) a whole-model OpenVINO timing
    of resnext50 that read 20% slow made guided placement keep ONNX Runtime's plan. The distinct plans within
    ``margin`` (default :data:`HEAD_TO_HEAD_MARGIN`; :data:`HEAD_TO_HEAD_REUSED_MARGIN` for a reused native
    whole-model timing, ``source`` :data:`REUSED_SOURCE`) of the fastest, at most ``most`` of them
    (:data:`HEAD_TO_HEAD_MAX`: the fastest, then reused timings flagged ``surprising``, then by timing), go to
    ``duel`` (label -> Plan, to label -> result: :func:`~collage_ml.measure.e2e.measure_head_to_head`).

    ``valid`` (label -> result, for the plans that ran correctly) is updated in place: a contender's result
    becomes its head-to-head result (the earlier median kept as ``earlier_median``), a contender the duel
    finds invalid is marked so and leaves ``valid``, and so does every plan that was not in the contest, so
    that the head-to-head timings are compared with each other only. Returns what was done, for the report
    (``plans``: label -> ``earlier_ms``, ``ms``; ``timed``: distinct plans run; ``seconds``), or None when
    one plan stood alone. A duel that fails as a whole (a crash) changes nothing and says so."""
    margin = HEAD_TO_HEAD_MARGIN if margin is None else margin
    most = HEAD_TO_HEAD_MAX if most is None else most
    by_canon: dict[tuple, list[str]] = {}
    for label in sorted(valid, key=lambda k: valid[k]["median"]):
        by_canon.setdefault(plans[label].canonical(), []).append(label)
    fastest = min(v["median"] for v in valid.values())
    reused = {label for label, v in valid.items() if v.get("source") == REUSED_SOURCE}

    def within(label: str) -> bool:
        extra = HEAD_TO_HEAD_REUSED_MARGIN if label in reused else 0.0
        return valid[label]["median"] <= fastest * (1 + max(margin, extra))

    close = [labels for labels in by_canon.values() if within(labels[0])]  # fastest first
    # after the fastest, reused timings that surprised the model (they stand in for an end-to-end run:
    # :func:`reused_whole_model_timings`), then the rest; the sort is stable, so each part keeps timing order
    rest = sorted(close[1:], key=lambda ls: not any(valid[k].get("surprising") for k in ls))
    close = sorted((close[:1] + rest)[:most], key=lambda ls: valid[ls[0]]["median"])
    if len(close) < 2:
        return None
    say("timing " + ", ".join(ls[0] for ls in close) + f" again head to head (within {margin:.0%} of the fastest"
        + (f", or {1 + HEAD_TO_HEAD_REUSED_MARGIN:g}x for a reused whole-model timing)"
           if any(ls[0] in reused for ls in close) else ")"))
    t0 = time.perf_counter()
    got = duel({ls[0]: plans[ls[0]] for ls in close})
    earlier = {label: valid[label]["median"] for labels in close for label in labels}
    if not any(r.get("valid") for r in got.values()):  # the duel itself failed (a crash, a timeout)
        say("the head-to-head timing failed (" + "; ".join(f"{k}: {r.get('error_text')}" for k, r in got.items())
            + "); keeping the earlier timings")
        return {"plans": {k: {"earlier_ms": v * 1e3, "ms": None} for k, v in earlier.items()},
                "timed": len(close), "seconds": time.perf_counter() - t0, "failed": True}
    summary = {}
    for labels in close:
        r = got.get(labels[0], {})
        for label in labels:
            summary[label] = {"earlier_ms": earlier[label] * 1e3, "ms": r["median"] * 1e3 if r.get("valid") else None}
            if r.get("valid"):
                valid[label].clear()
                valid[label].update(r, earlier_median=earlier[label])
            else:  # valid before, not now: out of the race, and the caller's results say why
                valid[label].update(valid=False, error_text=r.get("error_text"), earlier_median=earlier[label])
    for label in list(valid):
        if label not in summary or not valid[label].get("valid"):
            del valid[label]
    return {"plans": summary, "timed": len(close), "seconds": time.perf_counter() - t0}


#: guided mode: a whole-model plan whose native whole-model timing is at least this many seconds is not re-timed
#: end to end; faster ones are (their single-process timings are bimodal on some machines: docs/results/noise.md)
REUSE_WHOLE_MODEL_TIMING_ABOVE = 5e-3


def reused_whole_model_timings(plans: Mapping[str, Plan], whole_models: Sequence, cost_of: Mapping,
                               surprising: Callable[[object, float], bool]) -> dict[str, dict]:
    """label -> result for the one-partition plans whose whole-model candidate's native timing stands in for an
    end-to-end run (guided mode): re-timing costs a compile and a window. Timings under
    :data:`REUSE_WHOLE_MODEL_TIMING_ABOVE` are not reused.

    A timing far from the prediction (``surprising``) is flagged ``surprising``, and
    :func:`settle_close_contest` times it head to head ahead of other plans wherever it is within
    :data:`HEAD_TO_HEAD_REUSED_MARGIN` of the fastest. It used to be re-timed end to end first: on the Zen 5
    (family 26 model 2, 2026-12-01) a slow period read nasnet's whole model on OpenVINO at 17.6 ms in both
    its windows (10.1 ms before and after), and guided kept ONNX Runtime's 13.4 ms plan. Whole-model
    predictions are loose, so most whole-model timings surprised the model, and the close ones were then
    timed three times: natively, end to end, and head to head. On the Zen 5 (2026-12-02, pyinstrument
    profiles of ``collage-ml place --mode guided``) the end-to-end re-timings took 6.0 s of resnet50's 23.5 s
    search, and 8.7 s of resnet3d50's 36 s for Inductor's whole model, four times slower than OpenVINO's."""
    whole = {c.backend.name: c for c in whole_models}
    out = {}
    for label, pl in plans.items():
        c = whole.get(pl.partitions[0].backend) if len(pl.partitions) == 1 else None
        cost = cost_of.get(c.key) if c is not None else None
        if cost is not None and cost >= REUSE_WHOLE_MODEL_TIMING_ABOVE:
            out[label] = {"valid": True, "median": cost, "source": REUSED_SOURCE, "surprising": surprising(c, cost)}
    return out


def measure_plans_e2e(runner, graph, plans: Mapping[str, Plan], ref, say,
                       known: Mapping[str, dict] | None = None,
                       contest: int | None = HEAD_TO_HEAD_MAX) -> tuple[dict[str, dict], int]:
    """(label -> best end-to-end result, number of measurements made).

    ``known`` (label -> result) are plans already measured whole (guided mode: a
    one-partition plan is its whole-model candidate, timed natively); they are not run again.

    Round two (the reverse order, another process) times again the plans within :data:`SECOND_ROUND_MARGIN`
    of round one's best, but only where more of them are close than a head-to-head holds (``contest``
    distinct plans; None: always). Otherwise :func:`settle_close_contest`, which follows, times every one of
    them again side by side and replaces their earlier timings, so a second round would be paid for and
    thrown away; and a plan alone within the margin wins whatever its second reading. Skipping it saved one
    compile and timing window per close plan (README, "Search").
    """
    distinct: dict[tuple, list[str]] = {}
    for label, plan in plans.items():
        distinct.setdefault(plan.canonical(), []).append(label)
    order = list(distinct)
    best: dict[tuple, dict] = {}
    for canon, labels in distinct.items():
        for label in labels:
            if known and label in known:
                best[canon] = dict(known[label])
    order = [c for c in order if c not in best]
    count = 0
    for rnd, seq in enumerate((order, order[::-1])):
        if rnd == 1:
            first = [r["median"] for r in best.values() if r.get("valid")]
            cutoff = min(first) * (1 + SECOND_ROUND_MARGIN) if first else float("inf")
            close = [c for c, r in best.items() if r.get("valid") and r["median"] <= cutoff]
            if contest is not None and len(close) <= contest:
                break  # the head-to-head settles them
        for canon in seq:
            label = distinct[canon][0]
            if rnd == 0:
                say(f"measuring plan {label} end to end ({len(plans[label].partitions)} partitions)")
            elif not best[canon].get("valid") or best[canon]["median"] > cutoff:
                continue
            r = measure_plan(runner, graph, plans[label], ref, process=rnd)  # each round in its own process
            count += 1
            if canon not in best or (r.get("valid") and r["median"] < best[canon].get("median", float("inf"))):
                best[canon] = r
    return {label: best[canon] for canon, labels in distinct.items() for label in labels}, count
