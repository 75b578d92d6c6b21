"""One self-contained HTML report of a run directory: ``render_report(run_dir) -> report.html``.

The page has no external resources (a Content-Security-Policy forbids any network load), inline
SVG plots generated here, every number beside its plot in a sortable table, and one small inline
script (table sorting). Each section reads the Parquet tables it needs; when one is missing the
section shows a short note instead. Tables show their top rows only and say how many, so the
file stays small (well under 2 MB for GPT-2 small's 32,491 edges).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from reports.atomic import atomic_write_bytes
from reports.html_sections import (
    Missing,
    Tables,
    approximation_section,
    calibration_part,
    faithfulness_section,
    forest_section,
    graph_section,
    has_tokens,
    heads_part,
    layers_part,
    methods_in,
    note,
    num,
    order_methods,
    residual_part,
    stability_section,
    summary_section,
    tokens_section,
    variance_part,
    variance_summary_part,
)
from reports.html_svg import esc
from reports.rundir import MANIFEST, RunDir, RunDirError
from reports.tables import read_provenance

__all__ = ["REPORT_NAME", "SECTIONS", "OPTIONAL_SECTIONS", "TABLES", "render_report"]

REPORT_NAME = "report.html"
TABLES = (
    "edges", "edge_stats", "inclusion", "stability_vs_k", "faithfulness_vs_k", "approximation",
    "approximation_summary", "heads", "layers", "residual", "variance_components", "variance_summary", "summary",
    "coverage", "token_importance", "token_importance_diffs", "sink_heads", "sink_fit", "token_weights",
    "token_stability", "sink_stability", "sink_matching",
)
# (id, heading): the headings a reader (and the browser test) finds on every report.
SECTIONS = (
    ("summary", "Summary"),
    ("graph", "Circuit graph"),
    ("stability", "Circuit stability: Jaccard vs k"),
    ("forest", "Edge effects: top edges with confidence intervals"),
    ("approximation", "Approximation error: exact vs approximate"),
    ("faithfulness", "Faithfulness vs circuit size"),
    ("heads", "Head and layer stability across seeds"),
    ("variance", "Variance study: where the uncertainty comes from"),
    ("calibration", "Calibration: interval coverage vs N"),
)
# Sections shown only when the run holds their tables (a `circuitstat tokens` run, at its top or per model).
OPTIONAL_SECTIONS = (
    ("tokens", "Token contributions and attention sinks"),
)

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;margin:0;background:#fafafa}
header{background:#1f2d3d;color:#fff;padding:18px 28px}
header h1{margin:0 0 8px;font-size:22px}
header dl{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:2px 14px;margin:0;font-size:13px}
header dt{color:#9fb3c8}header dd{margin:0;word-break:break-all}
nav{padding:8px 28px;background:#eef2f6;font-size:13px;position:sticky;top:0;z-index:2;border-bottom:1px solid #dde3ea}
nav a{margin-right:14px;color:#1f4e79;text-decoration:none}
main{padding:4px 28px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:6px 18px 16px;margin:16px 0}
h2{font-size:18px;margin:10px 0}h3{font-size:15px;margin:14px 0 4px;color:#333}h4{font-size:13px;margin:12px 0 4px;color:#333}
.row{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
figure{margin:0;flex:0 0 auto;max-width:100%}
figcaption{font-size:12px;color:#444;max-width:640px;margin-top:4px}
svg.plot{max-width:100%;height:auto;background:#fff}
.tablebox{flex:1 1 360px;max-height:520px;overflow:auto;border:1px solid #eee;min-width:300px}
.tablebox table+table,.tablebox p+table{margin-top:12px}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{padding:2px 7px;border-bottom:1px solid #eee;white-space:nowrap}
th{background:#f3f5f7;position:sticky;top:0;cursor:pointer;text-align:left;user-select:none}
th.n,td.n{text-align:right;font-variant-numeric:tabular-nums}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
td.pass{color:#0a6b2d;font-weight:600}td.fail{color:#b00020;font-weight:600}
table.summary{width:auto;font-size:13px}
p.note{color:#7a5a00;background:#fff8e1;border-left:3px solid #f0b400;padding:6px 10px;margin:8px 0}
p.shown{font-size:11px;color:#666;margin:4px 6px}
footer{color:#777;font-size:12px;padding:0 28px 24px}
"""

# Sorting: click a header; numbers sort by their exact value (data-v), text alphabetically, blanks last.
JS = """
(function(){
  function key(td){var v=td.getAttribute('data-v');if(v!==null){return v===''?null:parseFloat(v);}return td.textContent;}
  var tables=document.querySelectorAll('table.sortable');
  for(var t=0;t<tables.length;t++){(function(table){
    var ths=table.tHead?table.tHead.rows[0].cells:[];
    for(var i=0;i<ths.length;i++){(function(th,col){
      th.addEventListener('click',function(){
        var asc=th.getAttribute('aria-sort')!=='ascending';
        for(var j=0;j<ths.length;j++){ths[j].removeAttribute('aria-sort');}
        th.setAttribute('aria-sort',asc?'ascending':'descending');
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){
          var x=key(a.cells[col]),y=key(b.cells[col]);
          if(x===null||y===null){return x===y?0:(x===null?1:-1);}
          var c=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));
          return asc?c:-c;});
        for(var r=0;r<rows.length;r++){body.appendChild(rows[r]);}
      });
    })(ths[i],i);}
  })(tables[t]);}
  document.documentElement.setAttribute('data-report-js','ok');
})();
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


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


def _header(run_dir: Path, manifest: dict[str, Any], T: Tables, methods: list[str]) -> tuple[str, str]:
    """Return (title, <dl> items) for the page header."""
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
    items = [
        ("model", _describe(model) or "—"),
        ("task", _describe(task) or "—"),
        ("methods", _describe(spec_methods) or ", ".join(methods) or "—"),
        ("N examples", _describe(n) or "—"),
        ("seed", _describe(seed) or "—"),
        ("circuitstat", version or "—"),
        ("run id", manifest.get("run_id") or "—"),
        ("created", created or "—"),
        ("run directory", str(run_dir)),
    ]
    stages = manifest.get("stages") if isinstance(manifest.get("stages"), dict) else {}
    if stages:
        items.append(("stages", ", ".join(f"{k} ({v.get('status', '?')})" if isinstance(v, dict) else k for k, v in stages.items())))
    present = [f"{t} ({T.get(t).num_rows:,})" for t in TABLES if T.path(t).exists()]
    items.append(("tables (rows)", ", ".join(present) or "none"))
    title = f"circuitstat report — {_describe(model) or run_dir.name}" + (f" on {_describe(task)}" if task else "")
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    return title, dl


# ----- page -------------------------------------------------------------------------------------
def _part(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Missing as e:
        return note(str(e))


def render_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Write the self-contained HTML report of run directory `run_dir` and return its path.

    `out` (a file, or a directory to hold report.html: see report_path) defaults to ``run_dir/report.html``. Every table is optional (its section then shows a
    note); a directory with neither manifest.json nor any report table is an error.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist; pass the --out directory of an audit run")
    path = report_path(run_dir, out)  # checked before the tables are read
    T = Tables(run_dir)
    has_manifest = (run_dir / MANIFEST).exists()
    if not has_manifest and not any(T.path(t).exists() for t in TABLES) and not has_tokens(T):
        raise RunDirError(
            f"{run_dir} has no {MANIFEST} and none of the report tables ({', '.join(t + '.parquet' for t in TABLES)}); "
            "is it the output directory of `circuitstat audit`?"
        )
    manifest: dict[str, Any] = {}
    manifest_note = ""
    if has_manifest:
        try:
            manifest = RunDir.read_manifest(run_dir)
        except RunDirError as e:
            manifest_note = note(f"manifest.json could not be read: {e}")
    else:
        manifest_note = note("manifest.json is missing: the header shows what the tables' provenance records.")

    found: list[str] = []
    for name in ("edge_stats", "stability_vs_k", "inclusion", "faithfulness_vs_k", "approximation"):
        found += methods_in(T.get(name))
    spec = manifest.get("spec") if isinstance(manifest.get("spec"), dict) else {}
    spec_m = _pick(spec, "methods")
    methods = order_methods(([str(m) for m in spec_m] if isinstance(spec_m, list) else []) + found)
    methods = [m for m in methods if m in found] or methods

    title, dl = _header(run_dir, manifest, T, methods)
    sections = {
        "summary": lambda: _part(lambda: summary_section(T)),
        "graph": lambda: _part(lambda: graph_section(T, methods)),
        "stability": lambda: _part(lambda: stability_section(T, methods)),
        "forest": lambda: _part(lambda: forest_section(T, methods)),
        "approximation": lambda: _part(lambda: approximation_section(T, methods)),
        "faithfulness": lambda: _part(lambda: faithfulness_section(T, methods)),
        "heads": lambda: "".join(_part(f) for f in (lambda: heads_part(T), lambda: layers_part(T), lambda: residual_part(T))),
        "variance": lambda: "".join(_part(f) for f in (lambda: variance_part(T), lambda: variance_summary_part(T))),
        "calibration": lambda: _part(lambda: calibration_part(T)),
        "tokens": lambda: _part(lambda: tokens_section(T, _sources(spec), _part)),
    }
    shown = [*SECTIONS, *((sid, h) for sid, h in OPTIONAL_SECTIONS if sid != "tokens" or has_tokens(T))]
    body = []
    for sid, heading in shown:
        body.append(f'<section id="{sid}"><h2>{esc(heading)}</h2>{sections[sid]()}</section>')
    nav = "".join(f'<a href="#{sid}">{esc(h.split(":")[0])}</a>' for sid, h in shown)
    page = (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><dl>{dl}</dl></header>"
        f"<nav>{nav}</nav><main>{manifest_note}{''.join(body)}</main>"
        f"<footer>Generated by circuitstat from the Parquet tables in this run directory. "
        "Numbers are rounded to three significant digits in the tables; hover a mark for its values, click a column header to sort.</footer>"
        f"<script>{JS}</script></body></html>\n"
    )
    try:
        atomic_write_bytes(path, page.encode("utf-8"))
    except OSError as e:
        raise _input_error(f"cannot write {path}: {e.strerror or e}; give an --out you can write to") from None
    return path


def _sources(spec: dict[str, Any]) -> list[str]:
    """Return the models of a cross-seed run (model-<i> is the i-th), as short labels."""
    models = spec.get("models")
    if not isinstance(models, list):
        return []
    # a local path reads best as its last two parts (the zoo's recipe/seed-S)
    return ["/".join(Path(_describe(m)).parts[-2:]) for m in models]


def _input_error(message: str) -> Exception:
    # imported only on this error path: rendering a report never imports circuits (or torch)
    from circuits.errors import InputError

    return InputError(message)


def report_path(run_dir: Path, out: str | os.PathLike[str] | None) -> Path:
    """Where the report of `run_dir` goes: `out` as a file, or report.html inside `out` as a directory.

    `out` is a directory when it is one, ends with a slash, or has no suffix (``--out reports/run1``
    makes reports/run1/report.html); a name with a suffix (``--out run1.html``) is the file. A path
    through an existing file, or an existing file that is not .html, is an InputError.
    """
    if out is None:
        return run_dir / REPORT_NAME
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
    return path


if __name__ == "__main__":  # pragma: no cover - convenience: python -m reports.html RUN_DIR [OUT]
    import sys

    print(render_report(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
