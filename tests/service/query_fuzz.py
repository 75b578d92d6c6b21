"""A differential fuzz of /query for server paths (issue 44, defect 1).

Sources: every catalog table function DuckDB lists that takes no argument (``duckdb_*()``, ``pragma_*()``), every
column of it, and every setting (``current_setting(name)``), all as text. Transforms: every scalar function
``duckdb_functions()`` lists from one VARCHAR to VARCHAR, and a few more that the issue names (``to_base64``,
``string_split``, ``replace``), in one layer and in two (every ordered pair). Channels: results and errors (one
layer is read back through ``error(...)``, so the error channel carries every transformed value). Strings that
are only a number (memory in use, counts: they vary from query to query) are no source: they hold no path.

Two checks, each on its own sufficient to flag a leak:
- direct: no server path, and no one-layer transform of one, appears in any response text;
- differential: two servers that differ in nothing but their paths (data directory, working directory, $HOME)
  give the same response to every query. A path, or any function of it, in anything a query reaches makes
  the two differ.
The queries are the service's own: ``ask(sql)`` posts to /query and returns the response's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

EXTRA = {"to_base64": "to_base64(encode({x}))", "string_split": "CAST(string_split({x}, '/') AS VARCHAR)",
         "replace": "replace({x}, '/', '|')", "concat": "concat({x}, {x})", "left": "left({x}, 40)"}
"""Transforms the issue names that are not VARCHAR -> VARCHAR functions of one argument."""
STATIC = ("duckdb_functions", "duckdb_keywords", "duckdb_types", "pragma_collations")
"""Catalogs fixed by the DuckDB build (no setting or object of the connection reaches them): one layer only."""
NOISE = re.compile(r"__duckdb_source_[0-9a-f]+(_\d+)?")
"""DuckDB's name for the Python scan of a registered table (a memory address): differs between any two connections."""

NUMBER = re.compile(r"-?[0-9.]+( ?[KMGTPE]?i?B| bytes)?")
"""A string that is only a number (with a unit of bytes): memory in use and counts vary between queries."""

Ask = Callable[[str], str]


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _rows(text: str) -> list[dict]:
    doc = json.loads(text)
    return doc.get("rows", []) if isinstance(doc, dict) else []


class Fuzz:
    """The queries of the fuzz, built from what the service's own DuckDB lists; ``run`` returns {query key: text}."""

    def __init__(self, ask: Ask, functions: Iterable[str] | None = None) -> None:
        self.ask = ask
        tables = _rows(ask("SELECT DISTINCT function_name AS f FROM duckdb_functions() WHERE function_type = 'table' "
                           "AND len(parameters) = 0 AND (function_name LIKE 'duckdb\\_%' ESCAPE '\\' "
                           "OR function_name LIKE 'pragma\\_%' ESCAPE '\\') ORDER BY 1"))
        self.tables = [r["f"] for r in tables]
        scalars = _rows(ask("SELECT DISTINCT function_name AS f FROM duckdb_functions() WHERE function_type = 'scalar' "
                            "AND len(parameter_types) = 1 AND parameter_types[1] = 'VARCHAR' "
                            "AND return_type = 'VARCHAR' ORDER BY 1"))
        every = {r["f"]: f"{r['f']}({{x}})" for r in scalars} | EXTRA
        self.functions = {f: every[f] for f in (functions or every)}
        self.settings = [r["name"] for r in _rows(ask("SELECT name FROM duckdb_settings() ORDER BY 1"))]

    def sources(self, out: dict[str, str]) -> tuple[str, str]:
        """Ask every source alone (into ``out``); (all sources, sources that depend on the connection) as SQL."""
        every, dynamic = [], []
        for t in self.tables:
            out[f"table {t}"] = text = self.ask(f"SELECT * FROM {t}()")
            if '"rows"' not in text:
                continue  # an error (it is checked as it is): not a source of strings
            cols = "CAST(COLUMNS(*) AS VARCHAR)"
            sql = f"SELECT s FROM (UNPIVOT (SELECT {cols} FROM {t}()) ON COLUMNS(*) INTO NAME col VALUE s)"
            every.append(sql)
            if t not in STATIC:
                internal = "internal" in (_rows(text)[0] if _rows(text) else {})
                dynamic.append(sql.replace(f"FROM {t}()", f"FROM {t}() WHERE NOT internal") if internal else sql)
        good = [f"SELECT CAST(current_setting({_q(s)}) AS VARCHAR) AS s" for s in self._settings(self.settings, out)]
        every, dynamic = every + good, dynamic + good
        # DuckDB's scan names aside (NOISE): the same strings on any two servers unless a path gets in
        # and strings that are a number (memory in use, counts) aside: they vary from query to query and hold no path
        norm = f"regexp_replace(s, {_q(NOISE.pattern)}, '_', 'g')"
        keep = f"s IS NOT NULL AND NOT regexp_full_match(s, {_q(NUMBER.pattern)})"
        return (f"src AS (SELECT DISTINCT {norm} AS s FROM ({' UNION ALL '.join(every)}) WHERE {keep})",
                f"src AS (SELECT DISTINCT {norm} AS s FROM ({' UNION ALL '.join(dynamic)}) WHERE {keep})")

    def _settings(self, names: list[str], out: dict[str, str]) -> list[str]:
        """The settings ``current_setting`` reads, asked all at once and halved where one fails (into ``out``)."""
        if not names:
            return []
        key = f"settings {names[0]}..{names[-1]}"
        out[key] = self.ask("SELECT " + ", ".join(f"CAST(current_setting({_q(s)}) AS VARCHAR) AS \"{i}\""
                                                  for i, s in enumerate(names)))
        if '"rows"' in out[key] or len(names) == 1:
            return names if '"rows"' in out[key] else []
        del out[key]
        half = len(names) // 2
        return self._settings(names[:half], out) + self._settings(names[half:], out)

    def pairs(self) -> dict[str, list[str]]:
        """{inner function: its outer functions} of the second layer: every ordered pair of which at most one is
        an ICU collation (the 141 ``icu_collate_*`` are one function in 141 locales; every pair of two of them
        would triple the fuzz's time)."""
        icu = {f for f in self.functions if f.startswith("icu_collate_")}
        return {f: [g for g in self.functions if not (f in icu and g in icu)] for f in self.functions}

    def run(self, layers: int = 2) -> dict[str, str]:
        """{query key: response text} of every query of the fuzz."""
        out: dict[str, str] = {}
        every, dynamic = self.sources(out)
        for name, f in self.functions.items():
            # every transformed value through the error channel (try(): a function's own error would depend on
            # which string DuckDB evaluates first, which differs between two runs of one query)
            out[f"error {name}"] = text = self.ask(f"WITH {every} SELECT error(string_agg(coalesce(try("
                                                   f"{f.format(x='s')}), '<null>'), chr(31) ORDER BY s)) AS e FROM src")
            if "<null>" in text:  # and the function's own error, on the first string (in order) it fails on
                out[f"raise {name}"] = self.ask(f"WITH {every} SELECT {f.format(x='s')} AS v FROM (SELECT s FROM src "
                                                f"WHERE try({f.format(x='s')}) IS NULL ORDER BY s LIMIT 1)")
        if layers < 2:
            return out
        for name, outer in self.pairs().items():
            f = self.functions[name]
            # a digest of the set of values per pair, as text ('h...': the comparison sets numbers aside)
            cols = ", ".join(f"'h' || bit_xor(hash(coalesce(try({self.functions[n].format(x='x')}), chr(0)))) "
                             f"AS \"{n}\"" for n in outer)
            out[f"layer2 {name}"] = self.ask(f"WITH {dynamic}, l1 AS (SELECT DISTINCT try({f.format(x='s')}) AS x "
                                             f"FROM src) SELECT count(*) AS n, {cols} FROM l1")
        return out


def transforms(functions: dict[str, str], secrets: Iterable[str]) -> dict[str, dict[str, str]]:
    """{function: {transformed secret: what it is}} for every one-layer transform of every secret (DuckDB without
    limits computes them), those of 12 characters or more (shorter ones occur by chance); under "" the secrets."""
    import duckdb

    con = duckdb.connect()
    secrets = list(secrets)
    found: dict[str, dict[str, str]] = {"": {s: s for s in secrets}}
    for name, f in functions.items():
        found[name] = {}
        for s in secrets:
            try:
                v = con.execute(f"SELECT {f.format(x=_q(s))}").fetchone()[0]
            except duckdb.Error:
                continue
            if isinstance(v, str) and len(v) >= 12:
                found[name][v] = f"{name}({s})"
    return found


def leaks(out: dict[str, str], found: dict[str, dict[str, str]]) -> list[str]:
    """Where a secret or a transform of one appears: 'key: what'. Every response is searched for the secrets; the
    channels of a function ("error NAME", which carries NAME of every source string, and "raise NAME", its own
    error on the first string it fails on) also for NAME of them.
    (A table's or setting's strings are all sources, so their transforms are searched there.)"""
    hits = []
    for key, text in out.items():
        name = key.split(" ", 1)[1] if key.startswith(("error ", "raise ")) else ""
        for v, what in {**found[""], **found.get(name, {})}.items():
            if v in text:
                hits.append(f"{key}: {what}")
    return hits


def _canonical(text: str) -> str:
    """A response with DuckDB's scan names and every number (memory in use, row counts) replaced: what is left
    is the text a path could be in."""
    def strip(v):
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, (int, float)) or (isinstance(v, str) and NUMBER.fullmatch(v)):
            return 0
        if isinstance(v, list):
            return [strip(x) for x in v]
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items()}
        return NOISE.sub("_", v)
    try:
        return json.dumps(strip(json.loads(text)), sort_keys=True)
    except ValueError:
        return NOISE.sub("_", text)


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The query keys whose responses differ between two servers, numbers and DuckDB's scan names aside."""
    return sorted(k for k in a.keys() | b.keys() if _canonical(a.get(k, "")) != _canonical(b.get(k, "")))
