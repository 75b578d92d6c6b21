"""circuitstat reports layer: provenance, atomic Parquet tables, run directories, SQL queries.

Works on arrays, tables and dicts only (no torch, no circuits/), so every part can write through it.
"""

from reports.atomic import atomic_write, atomic_write_bytes, cleanup_temp_files
from reports.lock import DirLock, RunLockedError, StaleLockWarning
from reports.provenance import hash_array, hash_bytes, hash_file, hash_json, provenance, seed_record, to_jsonable
from reports.query import connect, list_tables, query
from reports.rundir import RunDir, RunDirError, StageOutputError, StageSpecChangedError
from reports.tables import (
    PROVENANCE_KEY,
    matrix_to_table,
    read_provenance,
    read_table,
    table_to_matrix,
    write_matrix,
    write_table,
)

__all__ = [
    "PROVENANCE_KEY",
    "DirLock",
    "RunDir",
    "RunDirError",
    "RunLockedError",
    "StageOutputError",
    "StageSpecChangedError",
    "StaleLockWarning",
    "atomic_write",
    "atomic_write_bytes",
    "cleanup_temp_files",
    "connect",
    "hash_array",
    "hash_bytes",
    "hash_file",
    "hash_json",
    "list_tables",
    "matrix_to_table",
    "provenance",
    "query",
    "read_provenance",
    "read_table",
    "seed_record",
    "table_to_matrix",
    "to_jsonable",
    "write_matrix",
    "write_table",
]
