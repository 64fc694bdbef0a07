"""Worker processes: where candidates, plans and hand-offs are compiled and run, isolated from the search.

A :class:`Worker` is one persistent, fresh interpreter that receives picklable
tasks (anything with an ``execute() -> dict`` method: ``runner.Task``,
``e2e.PlanTask``, ``boundary.BoundaryTask``) and sends back their result
dicts. A crash (segfault, ``os.abort``) or a timeout costs that one task: it
comes back as a ``failed`` result, and the worker is restarted for the next.
Every worker's intra-op thread variables (:data:`THREAD_ENV`) are set to the
runner's thread count. :class:`~collage_ml.measure.runner.Runner` decides what
runs where.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

STARTUP_TIMEOUT = 120.0
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")


def _worker_main(fd: int, threads: int) -> None:
    """The worker's loop: receive a task, send back ``task.execute()``; ``None`` stops it."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    # torch is not imported here: the torch backends import it and set its threads themselves
    # (``backends.torch_backend.set_threads``), and importing it in every worker cost about 1 s of each start
    # (boot imports 1.73 s against 0.58 s on the Zen 5,
    # family 26 model 2, where ONNX Runtime's and OpenVINO's latencies did not change: benchmarks/worker_boot.py)
    # warm the imports before the first timed task (the tasks' own modules)
    import collage_ml.ir.importers  # noqa: F401
    import collage_ml.measure.tasks  # noqa: F401

    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if task is None:
            return
        conn.send(task.execute())


class Worker:
    """One persistent worker process; restarted after a crash or a timeout.

    The worker is a fresh, isolated interpreter (``python -I``) talking over a
    socket pair, not a ``multiprocessing`` child: that way it never re-imports
    the user's ``__main__``, so scripts without an ``if __name__ ==
    "__main__"`` guard work. Its import path is the interpreter's own plus
    those entries of the parent's ``sys.path`` that some loaded module came
    from (:func:`worker_path`), so backends defined in the user's importable
    modules resolve, while a stray ``numpy.py`` in the working directory is
    not imported unless the parent imported from that directory too.
    """

    def __init__(self, threads: int):
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self._stopping = False  # asked to exit (request_stop), not yet reaped

    def start(self) -> None:
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        for k in THREAD_ENV:
            env[k] = str(self.threads)
        env[WORKER_PATH_ENV] = os.pathsep.join(worker_path())
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _WORKER_BOOT, str(theirs.fileno()), str(self.threads)],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        # wait for the worker's imports, so a task's timeout covers only the task
        try:
            ok = self.conn.poll(STARTUP_TIMEOUT) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ok = False
        if not ok:
            self.kill()
            raise RuntimeError(f"measurement worker did not start within {STARTUP_TIMEOUT:g} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, task, timeout: float) -> dict:
        """Runs ``task.execute()`` in the worker; a crash or timeout gives an invalid result dict."""
        if not self.alive():
            self.kill()
            self.start()
        try:
            self.conn.send(task)
            if not self.conn.poll(timeout):
                self.kill()
                return {"valid": False, "failed": True, "error_text": f"timeout: no result after {timeout:g} s"}
            return self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = None
            if self.proc is not None:
                try:
                    code = self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            return {"valid": False, "failed": True, "error_text": f"worker crashed ({_describe_exit(code)})"}

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None
        self._stopping = False

    def request_stop(self) -> None:
        """Asks the worker to exit, without waiting (:meth:`stop` waits): a pool stops in parallel."""
        if self.alive() and not self._stopping:
            try:
                self.conn.send(None)
                self._stopping = True
            except OSError:
                pass

    def stop(self) -> None:
        if self.alive():
            try:
                self.request_stop()
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def stop_all(workers) -> None:
    """Stops ``workers``: all are asked to exit first, then each is reaped (an exit takes about 0.7 s with the
    backends loaded; one after the other that was 2.3 s for three, ``benchmarks/runner_close.py``)."""
    workers = list(workers)
    for w in workers:
        w.request_stop()
    for w in workers:
        w.stop()


WORKER_PATH_ENV = "COLLAGE_ML_WORKER_PATH"
_WORKER_BOOT = (
    "import os, sys; sys.path[:0] = [p for p in os.environ.get('COLLAGE_ML_WORKER_PATH', '').split(os.pathsep) if p]; "
    "from collage_ml.measure.worker import _worker_main; _worker_main(int(sys.argv[1]), int(sys.argv[2]))"
)


def worker_path() -> list[str]:
    """The entries of ``sys.path`` that some loaded module was imported from, in ``sys.path`` order.

    The worker starts isolated (no working directory, no ``PYTHONPATH``) and gets these in front of its own
    path, so it imports what the parent imported, from where the parent imported it, and nothing else.
    """
    entries = list(dict.fromkeys(os.path.abspath(p or os.curdir) for p in sys.path))
    used: set[str] = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str):
            continue
        f = os.path.abspath(f)
        best = max((e for e in entries if f.startswith(e.rstrip(os.sep) + os.sep)), key=len, default=None)
        if best is not None:
            used.add(best)
    return [e for e in entries if e in used]


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


if __name__ == "__main__":  # a worker started by hand: python -m collage_ml.measure.worker FD THREADS
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
