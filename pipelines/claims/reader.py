"""Reading a run directory for claims: lazy, cached tables (a cross-seed run's model-<i>/ parts
included), and the look-ups evaluators share, each raising ClaimError with the fix when the run
cannot answer (``missing`` when running or resuming the audit could)."""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any, Mapping

from circuitstat.core.schema import tail_flag

__all__ = ["ClaimError", "RunReader", "edge_known", "need", "not_applicable", "require_no_tail_seen",
           "require_reliable", "scalar", "token_part"]


class ClaimError(Exception):
    """A claim cannot be evaluated; `missing` when running (or re-running) the audit could fix it."""

    def __init__(self, reason: str, missing: bool = False, observed: dict | None = None):
        super().__init__(reason)
        self.reason, self.missing, self.observed = reason, missing, observed or {}


class RunReader:
    """Lazy, cached access to a run directory's tables. ``hints``: {table: what makes it}, quoted when the run lacks
    a table (the registry of claim kinds declares them: circuitstat.pipelines.claims.kinds.TABLE_HINTS)."""

    def __init__(self, path: Path, hints: Mapping[str, str] | None = None):
        self.path = path
        self.hints: Mapping[str, str] = hints or {}
        self._tables: dict[str, Any] = {}
        self._parts: dict[int, RunReader] = {}  # model-<i>/ of a cross-seed tokens run
        self._index: dict[tuple, dict] = {}  # (table, key columns) -> key values -> rows (see rows)
        self._columns: dict[str, frozenset] = {}  # table -> its column names (asked once per claim)
        self.manifest: dict | None = None
        self.unfinished: list[str] = []
        mpath = path / "manifest.json"
        if mpath.exists():
            from circuitstat.core.rundir import RunDir

            self.manifest = RunDir.read_manifest(path)  # RunDirError on a corrupt manifest
            stages = self.manifest.get("stages", {})
            if not isinstance(stages, dict):  # a hand-edited manifest: its tables' records cannot be read
                from circuitstat.core.errors import InputError

                raise InputError(f"{mpath} records its stages as a {type(stages).__name__}, not a mapping of stage "
                                 "records, so the run's tables cannot be checked against it; rerun the command that "
                                 "wrote the run")
            self.unfinished = sorted(n for n, s in stages.items() if isinstance(s, dict) and s.get("status") != "done")

    def table(self, name: str, columns: list[str], /):
        """Return table ``name`` (a pyarrow Table), read once; ClaimError when it or one of ``columns`` is absent."""
        if name not in self._tables:
            p = self.path / f"{name}.parquet"
            if not p.is_file():
                note = ""
                if self.unfinished:
                    note = f" (the run is incomplete: stage(s) {', '.join(self.unfinished)} did not finish; resume the audit)"
                raise ClaimError(f"the run {self.path} has no {name}.parquet; {self.hints.get(name, 'run the audit')}{note}",
                                 missing=True)
            try:
                from circuitstat.core.tables import read_table

                self._tables[name] = read_table(p)
            except Exception as e:  # corrupt file: pyarrow raises its own error types
                raise ClaimError(f"{p} cannot be read ({type(e).__name__}: {str(e)[:200]}); re-run the audit into a new directory",
                                 missing=True) from None
        t = self._tables[name]
        names = self._columns.get(name) or self._columns.setdefault(name, frozenset(t.column_names))
        lacking = [c for c in columns if c not in names]
        if lacking:
            raise ClaimError(f"{name}.parquet in {self.path} has no column(s) {lacking} (columns: {t.column_names}); "
                             "it was written by another version: re-run the audit", missing=True)
        return t

    def has_column(self, name: str, column: str, /) -> bool:
        """Whether table ``name`` (read once; ClaimError when absent) has ``column``."""
        return column in self.table(name, []).column_names

    def rows(self, name: str, columns: list[str], /, **eq: Any) -> list[dict]:
        """Return the rows of table ``name`` whose columns equal ``eq``, as dicts of ``columns`` and ``eq``'s keys."""
        # One index per (table, key columns), built once: a file of 60,000 claims must not filter the
        # table 60,000 times. Null never equals anything (as in SQL and pyarrow.compute.equal).
        # The index holds row positions from the key columns only: a million-edge edge_stats is not turned into
        # a million dicts of every column; the matching rows' wanted columns are read when asked.
        want = columns + list(eq)
        t = self.table(name, want)
        keys = tuple(sorted(eq))
        index = self._index.get((name, keys))
        if index is None:
            index = self._index[(name, keys)] = {}
            for i, key in enumerate(zip(*(t.column(k).to_pylist() for k in keys)) if keys else [()] * t.num_rows):
                index.setdefault(key, []).append(i)
        if any(v is None for v in eq.values()):
            return []
        hits = index.get(tuple(eq[k] for k in keys), [])
        if not hits:
            return []
        import pyarrow as pa

        found = t.select(list(dict.fromkeys(want))).take(pa.array(hits, pa.int64())).to_pylist()
        return [{c: r[c] for c in want} for r in found]

    def distinct(self, name: str, column: str, /, **eq: Any) -> list:
        """Return the sorted distinct non-null values of ``column`` in the rows of ``name`` matching ``eq``."""
        vals = {r[column] for r in self.rows(name, [column], **eq)}
        return sorted(v for v in vals if v is not None)

    def models(self) -> list[int]:
        """Indices i of the model-<i>/ parts of a cross-seed run ([] for a single-model run)."""
        found = (re.fullmatch(r"model-(\d+)", p.name) for p in self.path.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def part(self, model: int | None, table: str) -> "RunReader":
        """This run, or model-<model>/ of a cross-seed run, as the run that holds `table`."""
        models = self.models()
        if model is None:
            if models and not (self.path / f"{table}.parquet").is_file():
                raise ClaimError(f"the run {self.path} is a cross-seed run of {len(models)} models with {table} per "
                                 f"model; give 'model:' (one of {models}) to say which model the claim is about")
            return self
        if model not in models:
            where = f"its models are {models}" if models else "it holds one model: remove 'model:'"
            raise ClaimError(f"model {model} is not in the run {self.path} ({where})")
        if model not in self._parts:
            self._parts[model] = RunReader(self.path / f"model-{model}", self.hints)
        return self._parts[model]


def need(run: RunReader, table: str, column: str, value: Any, fix: str, **eq: Any) -> None:
    """Raise the 'add it to the spec' error if `value` is not among `column`'s values (given eq); for a method
    absent from `table` by design (the run's method_notes), the error says why instead."""
    why = not_applicable(run, value, table) if column == "method" else ""
    if why:  # a mask-learned method has no per-example rows: say why, not "re-run the audit"
        raise ClaimError(f"{table} has no rows for {value} by design, so it cannot back this claim: {why}")
    have = run.distinct(table, column, **eq)
    if value not in have:
        where = f" for {', '.join(f'{v}' for v in eq.values())}" if eq else ""
        if column == "k":
            msg = f"k={value} is not in the run's k grid {have}{where}; add it to the spec's k"
        elif column == "method":
            msg = f"method {value!r} is not in the run's {table} (methods: {have}); {fix}"
        else:
            msg = f"{column}={value!r} is not in the run's {table} (values: {have}){where}; {fix}"
        raise ClaimError(msg, missing=True)


def not_applicable(run: RunReader, method: str, table: str) -> str:
    """Why ``table`` has no rows for ``method`` by design, as the run's method_notes says ('' when it does not)."""
    if not (run.path / "method_notes.parquet").is_file():
        return ""
    return "; ".join(r["reason"] for r in run.rows("method_notes", ["reason"], method=method,
                                                    table=table.rsplit("/", 1)[-1]))


def edge_known(run: RunReader, edge: str) -> None:
    """Raise a clear error if `edge` is not an edge name of the run's graph."""
    names: list[str] = []
    for table in ("edges", "edge_stats"):
        try:
            names = run.distinct(table, "name")
            break
        except ClaimError:
            continue
    if not names:
        return  # cannot tell; the claim's own table decides
    if edge not in names:
        close = difflib.get_close_matches(edge, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; edges are named like {names[0]!r}"
        raise ClaimError(f"edge {edge!r} is not an edge of the run's model{hint}")


def scalar(run: RunReader, table: str, stat: str, what: str, **eq: Any) -> float:
    """Return the one value of ``stat`` in the rows matching ``eq``; ClaimError when none, several or NaN."""
    rows = run.rows(table, [stat], **eq)
    vals = [r[stat] for r in rows]
    if not vals:
        raise ClaimError(f"no row for {what} in {table}.parquet; re-run the audit", missing=True)
    distinct = {("nan" if isinstance(v, float) and math.isnan(v) else v) for v in vals}
    if len(distinct) > 1:
        raise ClaimError(f"{table}.parquet has {len(vals)} different values of {stat} for {what}; "
                         "narrow the claim (e.g. give k, match or pairs)")
    v = vals[0]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        why = nan_reason(run, table, stat, eq) or "too few resamples or a degenerate statistic"
        raise ClaimError(f"{stat} for {what} is undefined (NaN) in the run; it cannot be checked ({why})",
                         observed={stat: v})
    return float(v)


# the column in which a table records why a statistic is NaN (the same words the report shows)
NAN_NOTES = {"stability_vs_k": (("jaccard_data", "jaccard_pop", "phi_data"), "data_level_note"),
             "faithfulness_vs_k": (("f_selected", "fold_circuit_jaccard"), "f_selected_note")}


def nan_reason(run: RunReader, table: str, stat: str, eq: dict) -> str:
    """Why the run's ``table`` records ``stat`` as NaN in the rows ``eq``, as its stage wrote it ('' when unknown)."""
    prefixes, note = NAN_NOTES.get(table.rsplit("/", 1)[-1], ((), ""))
    if table.endswith("faithfulness_vs_k") and stat in ("cpr", "cmd"):
        note, prefixes = "area_note", (stat,)
    if table.endswith("faithfulness_vs_k") and stat.startswith(("f_conditional", "conditional_")):
        note, prefixes = "f_conditional_note", ("f_conditional", "conditional_")
    if not note or not stat.startswith(prefixes) or note not in run.table(table, []).column_names:
        return ""
    found = {str(r[note]) for r in run.rows(table, [note], **eq) if r.get(note)}
    return "; ".join(sorted(found))


def require_no_tail_seen(run: RunReader, table: str, stat: str, what: str, **eq: Any) -> None:
    """Refuse a bound on ci_low/ci_high of a row where a few prompts carry the estimate (its table's tail flag,
    core.schema.tail_flag: no_tail_seen in the per-edge mean tables, interval_reliable in the others, is false)."""
    flag = tail_flag(table)
    if stat not in ("ci_low", "ci_high") or flag is None:
        return
    if any(r[flag] is False for r in run.rows(table, [flag], **eq)):
        if flag == "no_tail_seen":
            more = ("; in a verified run, more verified prompts (verify.n) or, with the active design, a larger "
                    "verify.budget (16 or more exact cells per edge)" if table == "verified" else "")
            raise ClaimError(f"a few prompts carry the estimate of {what} in {table} (no_tail_seen = false), so its "
                             f"interval cannot back this claim; rerun with more prompts (--n){more}")
        raise ClaimError(f"the interval of {what} is flagged unreliable in {table} (interval_reliable = false: a few "
                         "prompts carry the estimate), so it cannot back this claim; rerun with more prompts (--n)")


#: the old name of :func:`require_no_tail_seen` (kept so imports of it still work)
require_reliable = require_no_tail_seen


def token_part(run: RunReader, model: int | None, table: str, k: int, measures: list[str],
               measure_columns: tuple[str, ...] = ("measure",)) -> RunReader:
    """The run (or model part) holding `table`; a ClaimError naming the fix when k or a measure (a value of one
    of `measure_columns`) is not in it."""
    part = run.part(model, table)
    names = sorted({v for c in measure_columns for v in part.distinct(table, c)})
    for m in measures:
        if m not in names:
            raise ClaimError(f"measure {m!r} is not in the run's {table} (measures: {names}); "
                             "check the spelling, or rerun `circuitstat tokens` with it in --measures")
    ks = part.distinct(table, "k")
    if k not in ks:
        raise ClaimError(f"k={k} is not in the run's k grid {ks} ({table}); rerun `circuitstat tokens` with it in --k")
    return part
