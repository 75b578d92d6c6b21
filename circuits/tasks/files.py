"""File tasks: a user's JSONL, CSV or Parquet file of ``clean, corrupted, answer, wrong_answer[, group]``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from .construct import task_from_texts
from .task import Task
from .validation import TaskValidationError, rows_str

FILE_COLUMNS = ("clean", "corrupted", "answer", "wrong_answer")


def _read_frame(path: Path):
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            return pd.read_json(path, lines=True, dtype=False)
        if suffix == ".json":
            try:
                return pd.read_json(path, dtype=False)
            except ValueError:
                return pd.read_json(path, lines=True, dtype=False)
        if suffix in (".csv", ".tsv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str,
                               keep_default_na=False, na_values=[""])
        if suffix == ".parquet":
            return pd.read_parquet(path)
    except ValueError as e:
        if "Expected object or value" in str(e) or path.stat().st_size == 0:
            return pd.DataFrame()
        raise TaskValidationError(f"{path}: could not read it as {suffix[1:]}: {e}") from e
    except Exception as e:  # pandas raises EmptyDataError for empty CSV
        if path.exists() and path.stat().st_size == 0 or type(e).__name__ == "EmptyDataError":
            return pd.DataFrame()
        raise TaskValidationError(f"{path}: could not read it as {suffix[1:]}: {e}") from e
    raise TaskValidationError(f"{path}: unknown task file type {suffix!r}; use .jsonl, .csv or .parquet")


def row_problems(df) -> list[str]:
    """One line per column of a task file's frame that has empty values (or, for the prompts, empty strings),
    naming its rows: every bad row and column at once."""
    cols = list(FILE_COLUMNS) + (["group"] if "group" in df.columns else [])
    out = []
    for c in cols:
        null = [int(i) for i in np.flatnonzero(df[c].isna().to_numpy())]
        blank = ([int(i) for i in np.flatnonzero(df[c].astype(str).str.len().to_numpy() == 0) if i not in null]
                 if c in ("clean", "corrupted") else [])
        if null:
            out.append(f"rows {rows_str(null)} have empty values in column {c!r}")
        if blank:
            out.append(f"rows {rows_str(blank)} have an empty prompt in column {c!r}")
    return out


def read_task_frame(path: str | os.PathLike, n: int | None = None):
    """The first ``n`` rows (all when None) of task file ``path`` as a DataFrame, after the checks that need no
    tokenizer: it exists, has the columns and rows; TaskValidationError naming the problem."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TaskValidationError(f"task file {p} does not exist")
    df = _read_frame(p)
    missing = [c for c in FILE_COLUMNS if c not in df.columns]
    if missing:
        raise TaskValidationError(
            f"task file {p}: missing column(s) {missing} (found {list(df.columns)}); a task file needs "
            f"columns {list(FILE_COLUMNS)} and optionally 'group'"
        )
    if len(df) == 0:
        raise TaskValidationError(f"task file {p} has no rows (empty data); add examples")
    if n is not None and int(n) > len(df):  # a run that records n must have used n examples
        raise TaskValidationError(
            f"task file {p} has {len(df)} row{'s' if len(df) != 1 else ''} but n={int(n)} examples were asked "
            f"for; set n to at most {len(df)} (attribute's --n, a spec's task.n), or add rows to the file")
    return df if n is None else df.iloc[: int(n)]


def file_task(
    path: str | os.PathLike,
    tokenizer,
    n: int | None = None,
    seed: int = 0,
    prepend_bos: bool = True,
    metric: str | Callable = "logit_diff",
    name: str | None = None,
    metric_kwargs: dict | None = None,
) -> Task:
    """A user task from JSONL, CSV or Parquet with columns ``clean, corrupted, answer, wrong_answer``
    (and optional ``group``). Answers are strings (each one token, e.g. " Mary") or integer ids.
    ``n`` keeps the first n rows; more than the file holds is refused (TaskValidationError naming both
    numbers), never silently fewer; None takes every row."""
    p = Path(path).expanduser()
    df = read_task_frame(p, n)
    task_name = name or p.stem
    problems = row_problems(df)
    if problems:
        raise TaskValidationError(f"task file {p}: " + "; ".join(problems) + "; fill or drop these rows")
    if tokenizer is None:
        raise TaskValidationError(f"task {task_name!r} has text prompts: pass the model's tokenizer")

    def col(c):
        vals = df[c].tolist()
        return [v.item() if isinstance(v, np.generic) else v for v in vals]

    return task_from_texts(
        task_name, tokenizer, col("clean"), col("corrupted"), col("answer"), col("wrong_answer"),
        group=col("group") if "group" in df.columns else None, prepend_bos=prepend_bos,
        metric=metric, metric_kwargs=dict(metric_kwargs or {}), meta={"source": str(p)},
    )

