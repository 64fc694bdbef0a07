"""The progress bar (collage_ml/ui.py): it draws only when it changes, never from a thread of its own,
because a bar redrawn while a worker times a kernel on a 2-core machine is contention (README, "Noise")."""

from __future__ import annotations

import threading
import time

from collage_ml.ui import Bar


def _rich_refresh_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if type(t).__name__ == "_RefreshThread"]


def test_a_shown_bar_runs_no_refresh_thread_and_counts_steps():
    before = len(_rich_refresh_threads())
    with Bar(True, rate=True) as bar:
        bar.task("measuring", 3)
        bar.step("onnxruntime")
        bar.step("torch", valid=False)
        time.sleep(0.05)
        assert len(_rich_refresh_threads()) == before  # nothing redraws it between steps
        task = bar._p.tasks[0]
        assert task.completed == 2 and bar.invalid == {"torch": 1}
        assert "torch 1" in task.fields["extra"]


def test_a_disabled_bar_does_nothing():
    bar = Bar(False).start().task("measuring", 3)
    bar.step("torch", valid=False)
    bar.phase("x")
    bar.planning("y")
    bar.planned()
    bar.close()
    assert bar._p is None and bar.invalid == {"torch": 1}
