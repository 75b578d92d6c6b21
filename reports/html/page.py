"""One self-contained HTML report of a run directory: ``render_report(run_dir) -> report.html``.

The page opens with the run's verdict (circuitstat.reports.verdicts, the same lines the terminal prints) and
shows a section only for the analyses the run holds. It has no external resources (a
Content-Security-Policy forbids any network load), inline SVG plots generated here, every number
beside its plot in a sortable table, and one small inline script (table sorting). Tables show
their top rows only and say how many, so the file stays small (well under 2 MB for GPT-2 small's
32,491 edges).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from circuitstat.core.atomic import atomic_write_bytes
from circuitstat.reports.html.assets import CSP, CSS, JS
from circuitstat.reports.analyses import has_tokens
from circuitstat.reports.html.common import Tables, methods_in, note, num, order_methods
from circuitstat.reports.html.sections import SECTIONS, Context, shown_sections
from circuitstat.reports.html.svg import esc
from circuitstat.core.rundir import MANIFEST, RunDir, RunDirError
from circuitstat.core.run_check import verify_outputs
from circuitstat.core.tables import read_provenance
from circuitstat.reports.verdicts import verdict

__all__ = ["REPORT_NAME", "SECTIONS", "TABLES", "render_report", "report_path"]

REPORT_NAME = "report.html"
TABLES = (
    "edges", "edge_stats", "inclusion", "stability_vs_k", "faithfulness_vs_k", "approximation",
    "approximation_summary", "heads", "layers", "residual", "variance_components", "variance_summary", "summary",
    "coverage", "token_importance", "token_importance_diffs", "sink_heads", "sink_fit", "token_weights",
    "token_stability", "sink_stability", "sink_matching", "verified", "verified_coefficients", "missed_edges",
    "published_circuit", "published_circuit_edges", "circuit_tests", "circuit_minimality", "claims", "edge_masks",
    "mask_fits", "method_notes",
)


# ----- header -----------------------------------------------------------------------------------
def _describe(v: Any) -> str:
    """Return a short human label for a spec value (dicts by their name/source, lists joined)."""
    if v is None:
        return ""
    if isinstance(v, dict):
        for k in ("name", "id", "source", "path", "kind"):
            if v.get(k) not in (None, ""):
                return _describe(v[k])
        return json.dumps(v, sort_keys=True)[:120]
    if isinstance(v, (list, tuple)):
        return ", ".join(_describe(x) for x in v)
    return str(v)


def _pick(d: Any, *keys: str) -> Any:
    if isinstance(d, dict):
        for k in keys:
            if d.get(k) not in (None, "", []):
                return d[k]
    return None


def _header(run_dir: Path, manifest: dict[str, Any], T: Tables, methods: list[str],
            hide_paths: bool = False) -> tuple[str, str]:
    """Return (title, header body): one line of the run's facts, the rest folded under "run details"."""
    spec = manifest.get("spec") if isinstance(manifest.get("spec"), dict) else {}
    prov = manifest.get("provenance") if isinstance(manifest.get("provenance"), dict) else {}
    tprov: dict[str, Any] = {}
    for name in ("edge_stats", "stability_vs_k", "heads", "edges", "variance_components"):
        if T.path(name).exists():
            tprov = read_provenance(T.path(name))
            break
    model = _pick(spec, "model", "models") or _pick(prov, "model") or _pick(tprov, "model")
    task = _pick(spec, "task") or _pick(prov, "task") or _pick(tprov, "task")
    spec_methods = _pick(spec, "methods", "method")
    n = _pick(spec, "n", "n_examples", "N")
    stats = T.get("edge_stats")
    if n is None and stats is not None and "n" in stats.column_names:
        nn = num(stats, "n")
        n = int(np.nanmax(nn)) if np.isfinite(nn).any() else None
    seed = _pick(spec, "seed", "seeds")
    if seed is None and isinstance(manifest.get("seed"), dict):
        seed = f"entropy {manifest['seed'].get('entropy')}"
    package = _pick(prov, "package") or _pick(tprov, "package")
    version = package.get("version", "") if isinstance(package, dict) else ""
    created = manifest.get("created_utc") or _pick(tprov, "created_utc") or ""
    if isinstance(model, list) and len(model) > 2:  # a cross-seed run: the first model and how many more
        model = f"{_describe(model[0])} and {len(model) - 1} more seeds"
    facts = [("model", _describe(model) or "—"), ("task", _describe(task) or "—"),
             ("methods", _describe(spec_methods) or ", ".join(methods) or "—"), ("N", _describe(n) or "—"),
             ("seed", _describe(seed) or "—")]
    details = [("circuitstat", version or "—"), ("run id", manifest.get("run_id") or "—"), ("created", created or "—"),
               ("run directory", "kept by the server that ran it" if hide_paths else str(run_dir))]
    stages = manifest.get("stages") if isinstance(manifest.get("stages"), dict) else {}
    if stages:
        details.append(("stages", ", ".join(f"{k} ({v.get('status', '?')})" if isinstance(v, dict) else k
                                            for k, v in stages.items())))
    present = [f"{t} ({T.get(t).num_rows:,})" for t in TABLES if T.path(t).exists()]
    details.append(("tables (rows)", ", ".join(present) or "none"))
    title = f"circuitstat report — {_describe(model) or run_dir.name}" + (f" on {_describe(task)}" if task else "")
    line = "".join(f'<span class="fact"><b>{esc(k)}</b> {esc(v)}</span>' for k, v in facts)
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in details)
    return title, f'<p class="facts">{line}</p><details><summary>run details</summary><dl>{dl}</dl></details>'


# ----- page -------------------------------------------------------------------------------------
def render_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                  min_excess: float | None = None, *, hide_paths: bool = False, trust_unrecorded: bool = False) -> Path:
    """Write the self-contained HTML report of run directory `run_dir` and return its path.

    `out` (a file, or a directory to hold report.html: see report_path) defaults to ``run_dir/report.html``;
    ``hide_paths`` (a server's report) shows no path of the run directory. Every
    table is optional (a section is shown only for the analyses the run holds); a directory with neither
    manifest.json nor any report table is an error. `min_excess` overrides the spec's heads.min_excess.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist; pass the --out directory of an audit run")
    path = report_path(run_dir, out)  # checked before the tables are read
    checked = verify_outputs(run_dir, trust_unrecorded=trust_unrecorded)  # the tables the run wrote (sha256 in the manifest)
    T = Tables(run_dir)
    has_manifest = (run_dir / MANIFEST).exists()
    if not has_manifest and not any(T.path(t).exists() for t in TABLES) and not has_tokens(T):
        raise RunDirError(
            f"{run_dir} has no {MANIFEST} and none of the report tables ({', '.join(t + '.parquet' for t in TABLES)}); "
            "is it the output directory of `circuitstat audit`?"
        )
    manifest, manifest_note = _manifest(run_dir, has_manifest)
    unchecked = checked.note("this run" if hide_paths else str(run_dir))
    manifest_note += note(unchecked + "; their numbers are shown as they are.") if unchecked else ""
    spec = manifest.get("spec") if isinstance(manifest.get("spec"), dict) else {}
    methods = _methods(T, spec)
    title, header = _header(run_dir, manifest, T, methods, hide_paths)
    shown = shown_sections(T)
    ctx = Context(T, methods, _sources(spec), verdict(run_dir, min_excess), frozenset(s.id for s in shown))
    body = "".join(s.html(ctx) for s in shown)
    nav = "".join(f'<a href="#{s.id}">{esc(s.heading.split(":")[0])}</a>' for s in shown)
    page = (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1>{header}</header>"
        f"<nav>{nav}</nav><main>{manifest_note}{body}</main>"
        f"<footer>Generated by circuitstat from the Parquet tables in this run directory. Numbers are rounded to three "
        "significant digits; every interval names its table, row and columns in the page's data attributes. Hover an "
        "interval for what it covers, click a column header to sort.</footer>"
        f"<script>{JS}</script></body></html>\n"
    )
    try:
        atomic_write_bytes(path, page.encode("utf-8"))
    except OSError as e:
        raise _input_error(f"cannot write {path}: {e.strerror or e}; give an --out you can write to") from None
    return path


def _manifest(run_dir: Path, has_manifest: bool) -> tuple[dict[str, Any], str]:
    """Return (manifest, note): the run's manifest ({} when absent or unreadable) and the note saying so."""
    if not has_manifest:
        return {}, note("manifest.json is missing: the header shows what the tables' provenance records.")
    try:
        return RunDir.read_manifest(run_dir), ""
    except RunDirError as e:
        return {}, note(f"manifest.json could not be read: {e}")


def _methods(T: Tables, spec: dict[str, Any]) -> list[str]:
    """Return the run's methods, exact first: the spec's order where the tables have them."""
    found: list[str] = []
    for name in ("edge_stats", "stability_vs_k", "inclusion", "faithfulness_vs_k", "approximation"):
        found += methods_in(T.get(name))
    spec_m = _pick(spec, "methods")
    methods = order_methods(([str(m) for m in spec_m] if isinstance(spec_m, list) else []) + found)
    return [m for m in methods if m in found] or methods


def _sources(spec: dict[str, Any]) -> list[str]:
    """Return the models of a cross-seed run (model-<i> is the i-th), as short labels."""
    models = spec.get("models")
    if not isinstance(models, list):
        return []
    # a local path reads best as its last two parts (the zoo's recipe/seed-S)
    return ["/".join(Path(_describe(m)).parts[-2:]) for m in models]


def _input_error(message: str) -> Exception:
    # imported only on this error path: rendering a report never imports circuits (or torch)
    from circuitstat.core.errors import InputError

    return InputError(message)


def report_path(run_dir: Path, out: str | os.PathLike[str] | None) -> Path:
    """Where the report of `run_dir` goes: `out` as a file, or report.html inside `out` as a directory.

    `out` is a directory when it is one, ends with a slash, or has no suffix (``--out reports/run1``
    makes reports/run1/report.html); a name with a suffix (``--out run1.html``) is the file. A path
    through an existing file, or an existing file that is not .html, is an InputError.
    """
    from circuitstat.core.outpath import check_output_file

    if out is None:
        return check_output_file(run_dir / REPORT_NAME, flag="report")
    path = Path(out)
    if path.is_dir() or str(out).endswith(("/", os.sep)) or (not path.exists() and not path.suffix):
        path = path / REPORT_NAME
    if path.is_dir():
        raise _input_error(f"--out {path} is a directory; give a file such as {path / REPORT_NAME} or a new directory")
    if path.exists() and path.suffix.lower() not in (".html", ".htm"):
        # replacing a report is normal; replacing some other file of the user's is not
        raise _input_error(f"--out {path} exists and is not an .html file; give a new path or an .html file to replace")
    blocking = next(a for a in path.parents if a.exists())
    if not blocking.is_dir():
        raise _input_error(f"--out {out}: {blocking} is a file, not a directory; give another --out")
    # the one output-path policy: a regular file or a new name; its directory exists or is the one new --out
    return check_output_file(path, flag="--out", new_dir=out is not None and path.parent == Path(out))
