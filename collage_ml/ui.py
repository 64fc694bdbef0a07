"""Terminal output shared by ``place``, ``collect`` and ``train``: one progress bar and table helpers.

This module sits at the bottom layer (tests/test_layers.py): it imports only ``rich``, and only when a
bar is shown or a table is built, so the search, the collector and the models may all use it.

- :class:`Bar` is the progress bar over measurements (and over any other items, such as featurized rows).
  It counts invalid results per backend and shows them; disabled, every method is a no-op. It redraws
  only when it changes, at most every 0.1 s (a burst of steps is drawn once), and has no refresh
  thread redrawing it while a kernel is timed.
- :func:`table` builds a rich ``Table`` from a title, column names and rows; :func:`print_table` prints one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Sequence


class Bar:
    """A rich progress bar; a no-op when ``enabled`` is false.

    ``stderr``: draw on stderr (collect) rather than stdout. ``rate``: add the items-per-minute and
    elapsed-time columns. ``eta``: show the time remaining (off when the total is only an upper bound).
    ``transient``: remove the bar when it stops. Use it as a context manager, or call :meth:`start` and
    :meth:`close`. :meth:`task` starts the counted task; :meth:`planning` shows an uncounted one.
    """

    def __init__(self, enabled: bool = True, *, stderr: bool = False, rate: bool = False, eta: bool = True,
                 transient: bool = False):
        self.enabled = enabled
        self.stderr, self.rate, self.eta, self.transient = stderr, rate, eta, transient
        self.invalid: dict[str, int] = {}  # backend -> invalid results stepped so far
        self._p: Any = None
        self._task = None
        self._plan_task = None
        self._drawn = 0.0  # time.monotonic() of the last draw
        self._timer: threading.Timer | None = None  # the one pending draw of changes inside MIN_REDRAW_SECONDS
        self._lock = threading.Lock()

    # -- lifetime ----------------------------------------------------------------------------
    def start(self) -> "Bar":
        if self.enabled and self._p is None:
            self._p = _rich_progress(self.stderr, self.rate, self.eta, self.transient)
            self._p.start()
        return self

    def close(self) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join()
        with self._lock:
            self._timer = None
            if self._p is not None:
                self._p.stop()
                self._p = None

    #: the least time between two draws: changes inside it are drawn once, when it has passed
    MIN_REDRAW_SECONDS = 0.1

    def _redraw(self) -> None:
        """Draws the bar now, or, within :attr:`MIN_REDRAW_SECONDS` of the last draw, once when they have passed;
        so a burst of steps (a chunk's results, featurized rows) costs one draw, not one per step."""
        with self._lock:
            if self._p is None:
                return
            wait = self._drawn + self.MIN_REDRAW_SECONDS - time.monotonic()
            if wait <= 0:
                self._draw()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._deferred)
                self._timer.daemon = True
                self._timer.start()

    def _deferred(self) -> None:
        with self._lock:
            self._timer = None
            if self._p is not None:
                self._draw()

    def _draw(self) -> None:  # with the lock held
        self._drawn = time.monotonic()
        self._p.refresh()

    def __enter__(self) -> "Bar":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- tasks -------------------------------------------------------------------------------
    def task(self, title: str, total: int | None) -> "Bar":
        """Starts (or restarts) the counted task: ``title`` with ``total`` items."""
        if self._p is not None:
            self._task = self._p.add_task(title, total=total, extra=self._invalid_text(), kind="measure")
            self._redraw()
        return self

    def set_total(self, total: int | None) -> None:
        """Changes the counted task's total (e.g. as more of the work becomes known)."""
        if self._p is not None and self._task is not None:
            self._p.update(self._task, total=total)
            self._redraw()

    def step(self, backend: str | None = None, valid: bool = True, advance: int = 1) -> None:
        """One item done (``advance`` of them); an invalid one is counted against ``backend``."""
        if not valid and backend is not None:
            self.invalid[backend] = self.invalid.get(backend, 0) + 1
        if self._p is not None and self._task is not None:
            self._p.update(self._task, advance=advance, extra=self._invalid_text())
            self._redraw()

    def phase(self, text: str) -> None:
        """Renames the counted task (e.g. the model and backend being measured)."""
        if self._p is not None and self._task is not None:
            self._p.update(self._task, description=text)
            self._redraw()

    def planning(self, label: str) -> None:
        """Shows an uncounted ``planning <label>`` task (before the counted one has a total)."""
        if self._p is None:
            return
        if self._plan_task is None:
            self._plan_task = self._p.add_task("planning", total=None, extra="", kind="plan")
        self._p.update(self._plan_task, description=f"planning {label}", advance=1)
        self._redraw()

    def planned(self) -> None:
        if self._p is not None and self._plan_task is not None:
            self._p.update(self._plan_task, total=1, completed=1, visible=False)
            self._redraw()

    def _invalid_text(self) -> str:
        if not self.invalid and not self.rate:
            return ""
        inv = ", ".join(f"{b} {n}" for b, n in sorted(self.invalid.items()))
        return f"invalid: {inv or 0}"


def steps(total: int, title: str, enabled: bool):
    """A transient bar over ``total`` items as one callable: ``step()`` per item, then ``step(done=True)``."""
    bar = Bar(enabled and total > 0, transient=True).start().task(title, total)

    def step(done: bool = False) -> None:
        if done:
            bar.close()
        else:
            bar.step()

    return step


def _rich_progress(stderr: bool, rate: bool, eta: bool, transient: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task):
            if task.fields.get("kind") != "measure":
                return Text("")
            if not task.elapsed or not task.completed:
                return Text("-- /min", style="progress.data.speed")
            return Text(f"{task.completed / task.elapsed * 60:.1f}/min", style="progress.data.speed")

    # plain text (markup=False): a configured backend's name (onnxruntime[spin=on]) reads as a style tag to rich
    cols: list = [TextColumn("{task.description}", style="bold" if rate else "none", markup=False), BarColumn(),
                  MofNCompleteColumn()]
    if rate:
        cols += [RateColumn(), TimeElapsedColumn()]
    if eta:
        cols += ([TextColumn("ETA")] if rate else []) + [TimeRemainingColumn()]
    cols.append(TextColumn("{task.fields[extra]}", markup=False))
    kw = {"console": Console(stderr=True)} if stderr else {}
    # drawn by Bar when it changes, never by a refresh thread: on a 2-core machine a bar redrawn 10 times a
    # second while a worker times a kernel is contention, and it turned a guided ResNet-50 placement that
    # measures 2 candidates into one that measured 102-177 (README, "What it is")
    return Progress(*cols, transient=transient, auto_refresh=False, **kw)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]] = (), *,
          right: Iterable[str] = (), caption: str | None = None):
    """A rich Table: ``columns`` (those in ``right`` right-justified), one row per item of ``rows``
    (None shows as an empty cell). Every string is shown as written (no rich markup)."""
    from rich.markup import escape
    from rich.table import Table

    right = set(right)
    # text, never markup: a configured backend's name (onnxruntime[spin=on]) reads as a style tag to rich
    t = Table(title=escape(title), caption=None if caption is None else escape(caption))
    for c in columns:
        t.add_column(escape(c), justify="right" if c in right else "left")
    for r in rows:
        t.add_row(*("" if v is None else escape(str(v)) for v in r))
    return t


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]] = (), *,
                right: Iterable[str] = (), stderr: bool = False) -> None:
    """Prints :func:`table` (on stdout, or stderr)."""
    from rich.console import Console

    Console(stderr=stderr).print(table(title, columns, rows, right=right))
