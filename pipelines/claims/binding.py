"""Binding a claims file to its run: the audit records the spec it was asked to run, ``check`` compares it with the
claims file's ``spec:`` (issue 47: a claims file naming ``n64.yaml`` passed, exit 0, on a run made from another spec).

The record is portable: a local file the spec names (model, task file, published circuit) enters as its name and
the sha256 of its bytes, not as the absolute path it had where the audit ran, so a run made in CI and checked on a
laptop binds when the files are the same. ``n_jobs`` is left out (results do not depend on the number of workers).
The record sits in the manifest's run provenance under ``spec_binding`` ({"sha256", "doc"}).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["BINDING_KEY", "binding_note", "spec_binding", "spec_differences"]

#: where the audit records the binding: manifest["provenance"][BINDING_KEY]
BINDING_KEY = "spec_binding"
_IGNORED = ("n_jobs",)


def _portable(value: str) -> Any:
    """A path-valued spec entry as {name, sha256} when it is a local file, {name} for a directory, else unchanged."""
    if not isinstance(value, str) or value.startswith(("random:", "zoo:", "hf:", "served:")):
        return value
    p = Path(value)
    if p.is_file():
        from circuitstat.core.provenance import hash_file

        return {"name": p.name, "sha256": hash_file(p)}
    if p.is_dir():
        return {"name": p.name, "directory": True}
    return value


def spec_binding(spec_doc: dict[str, Any]) -> dict[str, Any]:
    """Return {"sha256", "doc"} of an audit's spec document (audit_spec_doc of the spec as asked for, before the audit
    adds the circuit's sizes to k), portable across machines."""
    from circuitstat.core.provenance import hash_json

    doc = dict(spec_doc)
    for key in _IGNORED:
        doc.pop(key, None)
    if doc.get("model") is not None:
        doc["model"] = _portable(doc["model"])
    if doc.get("models") is not None:
        doc["models"] = [_portable(m) for m in doc["models"]]
    if isinstance(doc.get("task"), dict):
        doc["task"] = {**doc["task"], "name": _portable(doc["task"].get("name"))}
    if isinstance(doc.get("circuit"), dict):
        doc["circuit"] = {**doc["circuit"], "file": _portable(doc["circuit"].get("file"))}
    return {"sha256": hash_json(doc), "doc": doc}


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    """The leaves of a nested dict as {"a.b": value} (lists and file records are leaves)."""
    if isinstance(doc, dict) and not {"name", "sha256"} <= set(doc) and not doc.get("directory"):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): doc}


def _show(v: Any) -> str:
    if isinstance(v, dict) and "sha256" in v:
        return f"{v['name']} (sha256 {v['sha256'][:12]})"
    if isinstance(v, dict) and v.get("directory"):
        return f"directory {v['name']}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def spec_differences(want: dict[str, Any], have: dict[str, Any]) -> list[str]:
    """Return one phrase per key where the claims' spec (`want`) and the run's (`have`) differ ([] when they agree)."""
    a, b = _flat(want), _flat(have)
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append(f"{key}: {_show(a[key])} in the spec, absent from the run")
        elif key not in a:
            out.append(f"{key}: absent from the spec, {_show(b[key])} in the run")
        elif a[key] != b[key]:
            out.append(f"{key}: {_show(a[key])} in the spec, {_show(b[key])} in the run")
    return out


def binding_note(manifest: dict | None) -> str:
    """Return a short description of the spec a run records ('' when it records none)."""
    rec = ((manifest or {}).get("provenance") or {}).get(BINDING_KEY)
    if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str):
        return ""
    return f"spec sha256 {rec['sha256'][:12]}"
