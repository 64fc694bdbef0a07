"""User-facing errors.

Every error a user can cause (a bad model file, an unknown name, a missing
backend, a corrupt database) is a :class:`CollageError` subclass with a
message that names the problem in one line. The CLI prints that line and exits
with status 1; it shows a traceback only with ``--debug``.
"""


class CollageError(Exception):
    """A user-facing error: one clear line, no traceback in the CLI."""


class ModelError(CollageError):
    """The model given cannot be imported or used."""


class UnknownModelError(ModelError):
    """A zoo name that does not exist."""


class UnsupportedModelError(ModelError):
    """A valid model that collage-ml cannot handle (e.g. unresolvable dynamic shapes)."""


class BackendError(CollageError):
    """A backend is missing, unavailable, or failed."""


class PlanError(CollageError):
    """A plan or saved placed model is malformed, tampered with, or names a backend this install does not have."""


class DatabaseError(CollageError):
    """A measurement database is corrupt, foreign, or unreadable."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (cut at ``limit``), or its type name when it has none."""
    lines = str(e).strip().splitlines()
    return lines[0][:limit] if lines else type(e).__name__


def describe(e: BaseException, limit: int = 300) -> str:
    """``"TypeName: first line"`` (or just the type name), for error texts stored with measurements."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:limit]}" if lines else type(e).__name__
