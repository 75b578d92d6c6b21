"""The audit's score matrices as its stages read them: in blocks of edge columns, or whole within a bound.

An audit stores one score table per method (``scores_<method>.parquet``, [N examples, E edges] float32). At a
large model's size (Llama-3.1-8B: 1,592,881 edges; 512 prompts are 3.3 GB per method) the matrices must not
all sit in memory while the statistics run. :class:`RunScores` hands them out two ways:

* :meth:`RunScores.columns` for the stages whose estimators read edge columns in blocks (edge_stats:
  intervals and q-values; stability: stability vs k with its data-level intervals and inclusion; published:
  the mean scores): a fresh :class:`circuitstat.core.score_columns.ParquetColumns` that keeps at most
  :data:`BLOCK_BYTES` of columns, freed when the stage ends. The results equal the in-memory path's bit for
  bit (tests/pipelines/test_audit_scale.py compares every table column by column).
* :meth:`RunScores.whole` for the stages that select circuits on subsets of prompts or compare matrices
  (faithfulness's cross-fitting, approximation, verified, circuit_tests): a whole float32 array, loaded
  only when it fits :data:`WHOLE_BYTES`. :func:`check_whole_scores` refuses, before the run, a spec whose
  stages would load more, naming each stage, its size and the fix (InputError; ``--allow-large`` lifts it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.score_columns import DEFAULT_BLOCK_BYTES, ParquetColumns

BLOCK_BYTES = DEFAULT_BLOCK_BYTES
"""float32 bytes of edge columns one streamed matrix keeps at once (1 GiB)."""

WHOLE_BYTES = float(os.environ.get("CIRCUITSTAT_MAX_WHOLE_SCORES", 2 * 2**30))
"""Most bytes of score matrices a stage that needs them whole may load at once (2 GiB; the environment variable
``CIRCUITSTAT_MAX_WHOLE_SCORES`` overrides it, ``--allow-large`` lifts it)."""

STREAM_BYTES = 0
"""A matrix of more float32 bytes than this reaches the block-reading stages as ParquetColumns; 0: every one
(bench/audit_scale.py: as fast as in memory at small sizes, and bit-identical)."""

LIFT = "--allow-large"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class RunScores:
    """The score tables ``scores_<method>`` of an audit's run directory, read in blocks or whole (module doc)."""

    def __init__(self, run, methods, *, allow_large: bool = False) -> None:
        import pyarrow.parquet as pq

        self.paths = {m: Path(run.output_path(f"scores_{m}")) for m in methods}
        self.allow_large = allow_large
        first = next(iter(self.paths), None)  # None: only mask-learned methods, which write no score table
        self.n_examples = 0 if first is None else int(pq.ParquetFile(self.paths[first]).metadata.num_rows)
        self.n_columns = 0 if first is None else ParquetColumns(self.paths[first]).shape[1]
        self.loads: list[tuple[str, str]] = []  # (method, stage) of every whole load, for the tests

    @property
    def methods(self) -> list[str]:
        """The methods whose scores the run holds, in the spec's order."""
        return list(self.paths)

    @property
    def nbytes(self) -> int:
        """float32 bytes of one method's matrix."""
        return 4 * self.n_examples * self.n_columns

    def columns(self, method: str):
        """``method``'s [N, E] scores for a stage that reads edge columns in blocks: a ParquetColumns keeping at
        most BLOCK_BYTES (an in-memory array when the matrix is at most STREAM_BYTES)."""
        if self.nbytes <= STREAM_BYTES:
            return self._load(method)
        return ParquetColumns(self.paths[method], max_bytes=BLOCK_BYTES)

    def whole(self, method: str, stage: str, held: int = 1) -> np.ndarray:
        """``method``'s whole [N, E] float32 scores for ``stage``, which holds ``held`` such matrices at once;
        InputError when they exceed WHOLE_BYTES (check_whole_scores says so before the run)."""
        need = held * self.nbytes
        if need > WHOLE_BYTES and not self.allow_large:
            raise InputError(whole_message({stage: need}, self.n_examples, self.n_columns))
        self.loads.append((method, stage))
        return self._load(method)

    def _load(self, method: str) -> np.ndarray:
        from circuitstat.core.tables import read_table, table_to_matrix

        return np.asarray(table_to_matrix(read_table(self.paths[method], ["scores"])))


WHOLE_FIX = {"faithfulness": "set faithfulness: false", "approximation": "audit exact and the approximations in "
             "separate runs", "verified": "remove verify (or verify a sample of edges: verify.edges)",
             "stability": "verify a sample of edges (verify.edges) instead of every edge",
             "circuit_tests": "remove tests"}


def whole_stages(spec, n: int, n_cols: int) -> dict[str, int]:
    """{stage: bytes of score matrices it holds whole at once} for the stages of ``spec`` that need whole
    matrices, with ``n`` examples and ``n_cols`` edges (or nodes)."""
    from circuitstat.pipelines.runs.audit.masks import score_methods

    one = 4 * n * n_cols
    scored = score_methods(spec)  # a mask-learned method has no score matrix
    approx = [m for m in scored if m != "exact"]
    out: dict[str, int] = {}
    if spec.verify is not None and spec.verify.design == "active":
        # per method its scores and π in float64 (2 + 2), and the union's exact cells dense in float64 (2)
        out["verified"] = one * (4 * len(approx) + 2 + ("exact" in scored))
    elif spec.verify is not None:
        out["verified"] = one * (len(approx) + ("exact" in scored))
        if spec.verify.edges is None:  # the pseudo-scores of every approximate method, float64, beside each stage
            out["stability"] = 2 * one * len(approx)
    pseudo = out.get("stability", 0)
    if spec.faithfulness:
        out["faithfulness"] = one + pseudo
    if "exact" in scored and approx:
        out["approximation"] = 2 * one
    if spec.tests is not None:
        out["circuit_tests"] = one
    return out


def whole_message(stages: dict[str, int], n: int, n_cols: int) -> str:
    """The InputError text for stages that would load more whole score matrices than WHOLE_BYTES."""
    parts = [f"{s} ({_gib(b)}; to skip: {WHOLE_FIX[s]})" for s, b in stages.items()]
    return (f"the scores are {n:,} examples x {n_cols:,} columns ({_gib(4 * n * n_cols)} of float32 per method); "
            f"intervals, q-values and stability read them in blocks, but {', '.join(parts)} need whole matrices in "
            f"memory, above the limit of {_gib(WHOLE_BYTES)} (CIRCUITSTAT_MAX_WHOLE_SCORES); pass {LIFT} to load "
            "them anyway")


def check_whole_scores(spec, n: int, n_cols: int, *, allow_large: bool = False) -> None:
    """None; InputError, before the run, when a stage of ``spec`` would load more whole score matrices than
    WHOLE_BYTES (lifted by ``allow_large``)."""
    over = {s: b for s, b in whole_stages(spec, n, n_cols).items() if b > WHOLE_BYTES}
    if over and not allow_large:
        raise InputError(whole_message(over, n, n_cols))
