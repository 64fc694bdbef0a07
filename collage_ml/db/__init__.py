"""The measurement store: one SQLite file in WAL mode, the only store.

Rules it keeps:

- **Nothing committed is ever lost.** Every :meth:`Database.commit` is its own
  transaction with ``synchronous=FULL``, so a ``kill -9`` (or a power cut) at
  any moment loses at most the measurement being written. A key that exists
  already is never overwritten (``INSERT OR IGNORE``): the first measurement of
  ``(subgraph hash, backend, backend version, hardware fingerprint)`` stays.
- **Several writers, one file.** Processes may write one database at once; each
  write waits for the lock (``busy_timeout``) and is retried on
  ``database is locked``.
- **Foreign files are left alone.** A file that is not SQLite, an SQLite file of
  another application, a corrupt or truncated file, or a database of a newer
  schema raises :class:`~collage_ml.errors.DatabaseError` with one line naming
  the file. Such a file is only ever opened read-only, so it is never modified.

Schema (version :data:`SCHEMA_VERSION`, kept in ``PRAGMA user_version`` and in
the ``meta`` table, whose ``magic`` row is :data:`MAGIC`; the SQLite header's
application id is :data:`APPLICATION_ID`):

- ``hardware(fingerprint TEXT PRIMARY KEY, info JSON)`` (see ``measure.hardware``)
- ``subgraphs(hash TEXT PRIMARY KEY, onnx BLOB, n_nodes INT, ops TEXT)``: the
  standalone ONNX of each measured subgraph, once per hash, so featurizers can
  run again without the original model. ``ops`` is the comma-separated op types
  in node order.
- ``measurements(...)``: one row per :class:`~collage_ml.cost.Measurement`,
  ``UNIQUE(subgraph_hash, backend, backend_version, hardware, protocol)``.
  ``samples``, ``versions`` and ``extra`` are JSON text. ``status`` is
  ``valid``, ``invalid`` (a fact about the backend) or ``failed`` (a timeout or
  crash: a fact about one run); a failed row is the one kind a later commit of
  the same key replaces, and ``attempts`` counts the tries. ``protocol`` is the
  measurement protocol (``measure.timing``), so rows timed another way keep
  their own key.

- ``probes(hardware, backend, backend_version, protocol, probe_set, probe, median, subgraph_hash, timestamp)``:
  the probe set's latencies per machine and backend (``measure.probes``), a record of its own kind; ``median``
  is NULL where the backend cannot run that probe. This is a key's first calibration; each later one (a
  sitting of its own) is in ``recalibrations``, the same columns and ``sitting`` (when it started), added
  without a schema bump (``db.probes``); ``probe_nodes`` (key, ``probe``, ``timestamp``, ``node``) names the
  machine that measured each result, as ``extra.node`` does a measurement's (also additive), and
  ``probe_checks`` (key, ``timestamp``, ``node``, ``passes``, ``ratio``) how each backend's calibration checked
  out: the probe set is measured, a third of it again, and the whole a second and third time where the two
  disagree (``measure.probes.AGREE``, ``CHECK_EVERY``).

Schema 1 had neither ``status``, ``attempts``, ``protocol`` nor ``probes``: opening such a
file for writing migrates it in one transaction (every row kept, with protocol
``m1``, and timeouts and crashes classified as ``failed``); opening it
read-only reads it as if migrated, without writing.

- ``boundaries`` and ``plan_timings``: boundary (hand-off) costs per ordered backend pair and tensor size, and
  every plan judged end to end, keyed by plan hash: records of their own kinds (``db.records`` keeps them).
  They were added without a schema bump (the tables are additive). The boundary rows older versions stored
  among the measurements (subgraph hash ``boundary:<nbytes>``, no ONNX) are moved into ``boundaries`` by a
  writable open, and read as boundaries (never as measurements) by a read-only one.

The modules: ``database.py`` (:class:`Database`: opening, the lock, transactions and retries),
``schema.py`` (the schema, the checks that refuse foreign files, setup and migration), ``rows.py``
(the measurements table's row), ``measurements.py``, ``probes.py``, ``records.py`` (boundaries and
plan timings), ``merge.py``, ``export.py`` (Parquet) and ``sql.py`` (the SQLite plumbing they share).
"""

from collage_ml.db.database import DEFAULT_RETRY_S, DEFAULT_TIMEOUT_S, Database, default_db_path
# the measurements row as tests build it by hand (tests/test_records.py)
from collage_ml.db.rows import INSERT_MEASUREMENT as _INSERT_MEASUREMENT, measurement_row as _measurement_row
from collage_ml.db.schema import APPLICATION_ID, LEGACY_PROTOCOL, MAGIC, SCHEMA_VERSION

__all__ = [
    "APPLICATION_ID",
    "DEFAULT_RETRY_S",
    "DEFAULT_TIMEOUT_S",
    "LEGACY_PROTOCOL",
    "MAGIC",
    "SCHEMA_VERSION",
    "Database",
    "default_db_path",
]
