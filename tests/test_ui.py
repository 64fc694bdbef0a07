"""The progress bar (collage_ml/ui.py): it draws only when it changes, at most every 0.1 s, never from a
refresh thread of its own, because a bar redrawn while a worker times a kernel on a 2-core machine is
contention (README, "What it is"); and a burst of steps costs one draw, not one per step."""

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


def test_a_burst_of_steps_is_drawn_once_and_its_end_is_drawn():
    with Bar(True) as bar:
        bar.task("featurizing", 2000)
        drawn = []
        real = bar._p.refresh
        bar._p.refresh = lambda: (drawn.append(bar._p.tasks[0].completed), real())
        for _ in range(2000):
            bar.step()
        time.sleep(3 * Bar.MIN_REDRAW_SECONDS)
        assert 1 <= len(drawn) <= 3  # not 2000 draws
        assert drawn[-1] == 2000  # the burst's end is on screen, not its first step


def test_bracketed_backend_names_are_shown_as_written():
    """A configured backend's name (onnxruntime[skipln=off]) is text, not rich markup, in tables and bars."""
    from rich.console import Console

    from collage_ml.ui import table

    name = "onnxruntime[skipln=off]"
    con = Console(record=True, width=200)
    con.print(table(f"plans on {name}", ["plan", name], [(f"all on {name}", "1.0"), ("[bold]x[/]", None)]))
    text = con.export_text()
    assert text.count(name) == 3 and "[bold]x[/]" in text
    with Bar(True, rate=True) as bar:
        bar.task(f"measuring {name}", 2)
        bar.step(name, valid=False)
        con = Console(record=True, width=200)
        con.print(bar._p.make_tasks_table(bar._p.tasks))
        text = con.export_text()
    assert f"measuring {name}" in text and f"invalid: {name} 1" in text
