"""Output of a check: the results as an aligned text table and as JUnit XML (one testcase per claim)."""

from __future__ import annotations

import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .evaluation import ClaimResult

__all__ = ["format_results", "junit_xml", "record_check", "write_junit", "write_claims_table"]


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(s: Any) -> str:
    return _XML_BAD.sub("\ufffd", str(s))


def _one_line(s: str) -> str:
    return " ".join(str(s).split())


def format_results(results: list[ClaimResult], width: int = 48) -> str:
    """The results as an aligned text table: claim, status, observed, bound, reason."""
    head = ("claim", "status", "observed", "bound", "reason")
    rows = []
    for r in results:
        name = _one_line(r.name)
        if len(name) > width:
            name = name[: width - 3] + "..."
        rows.append((name, r.status.upper() if r.status != "pass" else "pass", _one_line(r.observed_text),
                     _one_line(r.bound), _one_line(r.reason)))
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(4)]
    lines = []
    for row in [head, *rows]:
        lines.append("  ".join(row[i].ljust(widths[i]) for i in range(4)) + "  " + row[4])
    return "\n".join(line.rstrip() for line in lines)


def junit_xml(results: list[ClaimResult], suite: str = "circuitstat check", seconds: float | None = None) -> bytes:
    """JUnit XML: one testcase per claim, with a <failure> or <error> element when it does not hold."""
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "error")}
    total = seconds if seconds is not None else sum(r.seconds for r in results)
    attrs = {"name": _xml_text(suite), "tests": str(len(results)), "failures": str(counts["fail"]),
             "errors": str(counts["error"]), "skipped": "0", "time": f"{total:.3f}"}
    root = ET.Element("testsuites", attrs)
    ts = ET.SubElement(root, "testsuite", {**attrs, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")})
    for r in results:
        tc = ET.SubElement(ts, "testcase", {"classname": f"circuitstat.claims.{r.claim.kind}",
                                            "name": _xml_text(r.name), "time": f"{r.seconds:.3f}"})
        details = f"bound: {r.bound}\nobserved: {r.observed_text}\nreason: {r.reason}"
        desc = getattr(r.claim, "description", None)
        if desc:
            details = f"claim: {desc}\n" + details
        if r.status == "fail":
            ET.SubElement(tc, "failure", {"message": _xml_text(r.reason), "type": "ClaimFailed"}).text = _xml_text(details)
        elif r.status == "error":
            ET.SubElement(tc, "error", {"message": _xml_text(r.reason), "type": "ClaimError"}).text = _xml_text(details)
        ET.SubElement(tc, "system-out").text = _xml_text(details)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(results: list[ClaimResult], path: str | os.PathLike[str], suite: str = "circuitstat check") -> Path:
    """Write JUnit XML for `results` to `path` atomically and return the path."""
    from circuitstat.core.atomic import atomic_write_bytes

    return atomic_write_bytes(path, junit_xml(results, suite))


def write_claims_table(results: list[ClaimResult], run_dir: str | os.PathLike[str]) -> Path:
    """Write the results as the run's claims table (``claims.parquet``, core/schema.py) and return its path.

    The report's verdict then lists one line per claim (``circuitstat report RUN`` after a check)."""
    from circuitstat.core.provenance import provenance
    from circuitstat.core.schema import schema_for
    from circuitstat.core.tables import to_arrow, write_table

    cols = {"index": [r.index for r in results], "name": [_one_line(r.name) for r in results], "kind": [r.claim.kind for r in results],
            "status": [r.status for r in results], "observed": [_one_line(r.observed_text) for r in results],
            "bound": [_one_line(r.bound) for r in results], "reason": [_one_line(r.reason) for r in results],
            "description": [str(getattr(r.claim, "description", None) or "") for r in results]}
    table = schema_for("claims").validate(to_arrow(cols))
    path = write_table(table, Path(run_dir) / "claims.parquet", provenance(method="claims check",
                                                                          params={"n_claims": len(results)}))
    if (Path(run_dir) / "manifest.json").is_file():  # recorded, so the readers (report, compare, query) accept it
        from circuitstat.core.run_check import record_tables

        record_tables(run_dir, [path])
    return path


def record_check(results: list[ClaimResult], run_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``claims.parquet`` and re-render ``report.html`` in ``run_dir`` under the run's lock; return both paths.

    InputError, with nothing written, when another process holds the run's lock (an audit writing it) or
    a table changed since the run wrote it. A report that fails to render puts the earlier claims table back.
    """
    from circuitstat.core.errors import InputError
    from circuitstat.reports.html import render_report
    from circuitstat.core.lock import DirLock, RunLockedError
    from circuitstat.core.rundir import LOCK
    from circuitstat.core.run_check import verify_outputs

    run_dir = Path(run_dir)
    lock = DirLock(run_dir / LOCK)
    try:
        lock.acquire()
    except RunLockedError as e:
        raise InputError(f"not recorded: {e}") from None
    try:
        verify_outputs(run_dir)  # again under the lock: the verdicts are about the tables now there
        claims, mpath = run_dir / "claims.parquet", run_dir / "manifest.json"
        manifest = mpath.read_bytes() if mpath.is_file() else None
        before = claims.read_bytes() if claims.is_file() else None
        try:
            table = write_claims_table(results, run_dir)  # recorded in the manifest
            page = render_report(run_dir)
        except BaseException:
            from circuitstat.core.atomic import atomic_write_bytes

            if before is None:
                claims.unlink(missing_ok=True)
            else:
                atomic_write_bytes(claims, before)
            if manifest is not None:
                atomic_write_bytes(mpath, manifest)
            raise
        return table, page
    finally:
        lock.release()
