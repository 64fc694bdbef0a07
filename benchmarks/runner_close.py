"""How long closing a runner's worker pool takes: one worker after the other, against all asked at once.

    .venv/bin/python benchmarks/runner_close.py [--workers 3] [--rounds 3]

Every ``place`` and ``collect`` ends by stopping its measurement workers. Each
worker has imported the backends (torch, onnxruntime, OpenVINO), and its exit
takes a noticeable part of a second. This starts ``--workers`` workers, has
each import the default CPU backends (as a measurement would), and times two
ways of stopping them, alternately, ``--rounds`` times each: ``sequential``
(``Worker.stop`` on each in turn, what ``Runner.close`` did before) and
``parallel`` (``worker.stop_all``, which ``Runner.close`` calls: every worker
is asked to exit first, then each is reaped). It prints the median seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from collage_ml.measure.worker import Worker, stop_all


class _ImportBackends:
    """A task that loads what a measurement loads, so the exit has something to tear down."""

    def execute(self) -> dict:
        from collage_ml.backends.base import resolve_backends

        for b in resolve_backends(None):
            b.versions()
        return {"valid": True}


def _pool(n: int) -> list[Worker]:
    # the worker unpickles the task by its module's name, which must not be __main__
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.runner_close import _ImportBackends as task

    ws = [Worker(2) for _ in range(n)]
    for w in ws:
        w.start()
        r = w.run(task(), timeout=120)
        if not r.get("valid"):
            raise SystemExit(f"worker failed: {r.get('error_text')}")
    return ws


def sequential(ws: list[Worker]) -> None:
    for w in ws:
        w.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"sequential": [], "parallel": []}
    for _ in range(args.rounds):
        for name, stop in (("sequential", sequential), ("parallel", stop_all)):
            ws = _pool(args.workers)
            t = time.perf_counter()
            stop(ws)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:10s} median {med[k]:.3f} s  ({', '.join(f'{x:.3f}' for x in v)})")
    print(f"sequential / parallel: {med['sequential'] / med['parallel']:.2f}x")


if __name__ == "__main__":
    main()
