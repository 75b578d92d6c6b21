"""The check: a claims file, its run (or the audit its spec describes, run when needed) and the results.

:func:`check` finds the run (``--run``, the file's ``run:``, or a content-addressed directory under
the cache for its ``spec:``), evaluates the claims, and runs (or resumes) the audit only when a spec is
given, the run is missing, unfinished or lacks what a claim needs, and :func:`spec_problem` finds that
the spec can answer every claim.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitstat.core.errors import InputError

from ..yamlio import read_yaml_strict, redacted_failure, redacted_validation_message
from .bounds import bound_text
from .evaluation import ClaimResult, evaluate_claims
from .kinds import TOKEN_KINDS
from .models import ClaimsFile
from .parsing import load_claims
from .reader import RunReader

__all__ = ["CheckReport", "check", "default_run_dir", "spec_problem"]


def spec_problem(claim: Any, spec: Any) -> str | None:
    """Why running the audit of `spec` cannot answer `claim` (None when it can)."""
    methods = list(spec.methods)
    kind = claim.kind
    if kind in TOKEN_KINDS:
        return (f"{kind} claims are answered by `circuitstat tokens`, which the audit does not run; "
                "pass --run DIR of a tokens run")
    method = getattr(claim, "method", None)
    if method is not None and method not in methods:
        extra = " and 'exact'" if kind == "approximation" and "exact" not in methods else ""
        return f"method {method!r} is not in the spec's methods {methods}; add it{extra}"
    if kind == "approximation" and "exact" not in methods:
        return f"approximation is measured against 'exact', which is not in the spec's methods {methods}; add it"
    k = getattr(claim, "k", None)
    if k is not None and kind != "approximation" and k not in spec.k:
        return f"k={k} is not in the spec's k {list(spec.k)}; add it to the spec's k"
    if kind == "faithfulness" and not spec.faithfulness:
        return "the spec has 'faithfulness: false'; set it to true"
    verify = getattr(spec, "verify", None)
    if kind in ("verified_edge", "missed_edges") and verify is None:
        return "verified claims need a verified run; add verify: {n: 16} to the spec (docs/verified.md)"
    if kind == "missed_edges" and verify.edges is None:
        return ("missed_edges claims need an edge subset; add edges: {top: m, random: r} and tau to the spec's "
                "verify")
    if kind in ("head_stability", "layer_stability") and len(spec.sources) < 2:
        return "head stability needs several seeds; list two or more models under 'models:' in the spec"
    if kind == "head_stability":
        for key in ("match", "pairs"):
            want = getattr(claim, key)
            if want is not None and getattr(spec.heads, key) != want:
                return f"the claim asks for {key}={want!r} but the spec has heads.{key}: {getattr(spec.heads, key)}"
    return None


def _load_spec(path: Path, *, redact: bool = True, allow_outside: bool = False):
    """The audit spec at `path` through the strict YAML reader, validated as circuitstat.pipelines.spec does.

    With `redact` (the spec was named by a claims file, which may come from someone else) errors
    never quote the spec's text, keys or values: ``spec: /etc/shadow`` must not print the shadow
    file. See circuitstat.pipelines.yamlio for the rule.
    """
    from pydantic import ValidationError

    from circuitstat.pipelines.spec import AuditSpec, confine_paths, parse_spec

    data = read_yaml_strict(path, quote=not redact)
    if not redact:
        return confine_paths(parse_spec(data, str(path)), path, allow_outside=allow_outside)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise InputError(f"invalid spec {path}: the top level is {what}; it must be a mapping of keys "
                         "(model, task, methods, ...)")
    try:
        spec = AuditSpec.model_validate(data)
    except ValidationError as exc:
        raise InputError(redacted_validation_message(exc, data, AuditSpec, f"invalid spec {path}")) from None
    except RecursionError:
        raise InputError(f"invalid spec {path}: nested too deeply") from None
    return confine_paths(spec, path, allow_outside=allow_outside)


@dataclass
class CheckReport:
    """Results of a check, where they came from and the exit code they imply."""

    results: list[ClaimResult]
    run_dir: Path
    source: str
    ran_audit: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "error")}

    @property
    def exit_code(self) -> int:
        c = self.counts
        return 2 if c["error"] else (1 if c["fail"] else 0)


def _cache_dir() -> Path:
    from circuitstat.circuits.cache import cache_dir  # torch-free: check stays fast

    return cache_dir()


def default_run_dir(spec: Any, spec_path: Path) -> Path:
    """Where check puts the audit of `spec` when no run directory is given (content-addressed)."""
    doc = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    key = hashlib.sha256(doc.encode()).hexdigest()[:16]
    return _cache_dir() / "runs" / f"{spec_path.stem}-{key}"


def _is_complete(run_dir: Path) -> bool:
    if not (run_dir / "manifest.json").is_file():
        return False
    try:
        return not RunReader(run_dir).unfinished
    except Exception:
        return False


def check(claims: str | os.PathLike[str] | ClaimsFile, run: str | os.PathLike[str] | None = None,
          *, echo=None, allow_outside: bool = False) -> CheckReport:
    """Load the claims (InputError if malformed), find or make the run, evaluate every claim.

    `run` overrides the file's ``run:``. The audit (circuitstat.pipelines.audit.run.run_audit) runs only when a spec
    is given and the run is missing, unfinished or lacks what a claim needs, and only after the spec
    was checked to contain everything the claims need. The file's ``run:`` and ``spec:`` must stay
    inside its directory tree unless `allow_outside` (``--allow-outside``).
    """
    cf = claims if isinstance(claims, ClaimsFile) else load_claims(claims)
    source = cf.source or "<claims>"
    say = echo or (lambda msg: None)
    spec_path = cf.spec_path(allow_outside)
    file_run = cf.run_path(allow_outside)  # checked even when --run overrides it: a bad file is bad
    spec = None
    if spec_path is not None:
        try:
            spec = _load_spec(spec_path, allow_outside=allow_outside)
        except InputError as e:
            raise InputError(f"{e} (the spec named by 'spec:' in {source})") from None
    run_dir = Path(run) if run is not None else file_run
    if run_dir is None:
        if spec is None:
            raise InputError(f"no run to check: pass --run DIR (a finished audit's run directory), "
                             f"or set 'run:' or 'spec:' in {source}")
        run_dir = default_run_dir(spec, spec_path)
    if run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"run directory {run_dir} is a file; pass the run directory")

    report = CheckReport([], run_dir, source)
    have_run = run_dir.is_dir() and ((run_dir / "manifest.json").exists() or any(run_dir.glob("*.parquet")))
    if have_run:
        report.results = evaluate_claims(cf, run_dir)
        needs_audit = any(r.missing for r in report.results) or not _is_complete(run_dir)
        if not needs_audit or spec is None:
            if spec is None and any(r.missing and r.claim.kind not in TOKEN_KINDS for r in report.results):
                report.notes.append(f"give 'spec:' in {source} to let check run the audit these claims need")
            return report
    elif spec is None:
        raise InputError(f"run directory {run_dir} {'has no run' if run_dir.is_dir() else 'does not exist'}; "
                         f"pass --run DIR of a finished audit, or give 'spec:' in {source} so check can run the audit")

    # Run (or resume) the audit, but only if it can answer every claim.
    problems = [(i, spec_problem(c, spec)) for i, c in enumerate(cf.claims)]
    problems = [(i, p) for i, p in problems if p]
    if problems:
        results = report.results or [
            ClaimResult(i, c, c.label(i), "pass", {}, bound_text(c), "", False) for i, c in enumerate(cf.claims)
        ]
        bad = dict(problems)
        out = []
        for r in results:
            if r.index in bad:
                out.append(ClaimResult(r.index, r.claim, r.name, "error", r.observed, r.bound,
                                       f"the audit of {spec_path} cannot answer this claim: {bad[r.index]}", True))
            elif not report.results or r.missing:
                out.append(ClaimResult(r.index, r.claim, r.name, "error", r.observed, r.bound,
                                       (r.reason + "; " if r.reason else "") + "not evaluated: the audit was not run "
                                       "because the spec cannot answer other claims", True))
            else:
                out.append(r)
        report.results = out
        return report

    from circuitstat.pipelines.audit.run import run_audit  # heavy (torch); only when an audit is needed

    say(f"running the audit of {spec_path} into {run_dir} ...")
    try:
        run_audit(spec, run_dir)
    except Exception as e:  # noqa: BLE001 - errors from building its model or task may quote the spec's values
        message = redacted_failure(e, f"the spec named by 'spec:' in {source}",
                                   f"circuitstat audit {spec_path} --out DIR")
        if message is None:
            raise
        raise InputError(message) from None
    report.ran_audit = True
    report.results = evaluate_claims(cf, run_dir)
    return report
