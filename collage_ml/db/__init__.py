"""The measurement store (``database.py``) and its tables for records of their own kinds (``records.py``)."""

from collage_ml.db.database import (
    _INSERT_MEASUREMENT,
    APPLICATION_ID,
    DEFAULT_RETRY_S,
    DEFAULT_TIMEOUT_S,
    LEGACY_PROTOCOL,
    MAGIC,
    SCHEMA_VERSION,
    Database,
    _measurement_row,
    default_db_path,
)

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
