"""circuitstat reports layer: the ground floor every package may import, and the run directory's I/O.

The floor (contracts): errors (``circuitstat.core.errors``), the Result and Estimator bases
(``circuitstat.core.results``, ``circuitstat.core.estimator``), the JSON conversion (``circuitstat.core.provenance.to_jsonable``),
atomic writes (``circuitstat.core.atomic``), seeds and their records (``circuitstat.core.seeds``) and the one top-k
(``circuitstat.core.topk``). I/O on top of it: Parquet tables with provenance, the table schema, run
directories, SQL queries, the HTML report. Works on arrays, tables and dicts only: reports imports
nothing from circuits/, stats/ or pipelines/ (tests/test_layers.py) and never torch.

Names load lazily (PEP 562): ``from circuitstat.core.errors import InputError`` does not import pyarrow.
"""

from __future__ import annotations

from circuitstat.core.lazy import lazy_names

_MODULES = {
    ".atomic": ["atomic_write", "atomic_write_bytes", "cleanup_temp_files"],
    ".lock": ["DirLock", "RunLockedError", "StaleLockWarning"],
    ".provenance": ["hash_array", "hash_bytes", "hash_file", "hash_json", "provenance", "to_jsonable"],
    ".seeds": ["seed_record"],
    ".query": ["connect", "list_tables", "query"],
    ".rundir": ["RunDir", "RunDirError", "StageOutputError", "StageSpecChangedError"],
    ".tables": ["PROVENANCE_KEY", "matrix_to_table", "read_provenance", "read_table", "table_to_matrix",
                "write_matrix", "write_table"],
}
__all__, __getattr__ = lazy_names(__name__, _MODULES)
