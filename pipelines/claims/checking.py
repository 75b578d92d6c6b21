"""The check: a claims file, its run (or, with --run-audit, the audit its spec describes) and the results.

:func:`check` finds the run (``--run``, the file's ``run:``, or a content-addressed directory under
the cache for its ``spec:``) and evaluates the claims. It only reads a finished run (an audit's or a
tokens run): a missing, unfinished or foreign run is refused with nothing written. Only when asked
(``run_audit``, ``--run-audit``) does it run or resume the audit, and then only when a spec is given, the
run is missing, unfinished or lacks what a claim needs, the run directory is new or an audit's, and
:func:`spec_problem` finds that the spec can answer every claim.
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
from .evaluation import ClaimResult, evaluate_claims
from .claimsfile import ClaimsFile
from .kinds import KINDS, TOKEN_KINDS, bound_text
from .parsing import load_claims

__all__ = ["CheckReport", "check", "claim_sizes", "default_run_dir", "preflight", "spec_problem"]


def spec_problem(claim: Any, spec: Any) -> str | None:
    """Why running the audit of `spec` cannot answer `claim` (None when it can): its kind's ``requires``."""
    return KINDS[claim.kind].requires(claim, spec)


def claim_sizes(cf: ClaimsFile) -> list[int]:
    """Return the circuit sizes k the claims ask about (an audit's k grid must hold them; a kind whose k is not a
    circuit size, approximation's top_k_overlap, says so in its registry entry)."""
    return sorted({c.k for c in cf.claims if getattr(c, "k", None) is not None and KINDS[c.kind].k_is_circuit_size})


def preflight(cf: ClaimsFile, spec: Any, what: str) -> None:
    """None when the audit of `spec` can answer every claim of `cf` (and `cf`'s own spec, if any, is `spec`);
    else InputError listing each claim it cannot answer, before any work (issue 47: 186 s spent first)."""
    from circuitstat.pipelines.runs.audit.run import audit_spec_doc

    from .binding import spec_binding, spec_differences

    problems = [f"{c.label(i)}: {p}" for i, c in enumerate(cf.claims) if (p := spec_problem(c, spec))]
    own = cf.spec_path(False) if cf.spec is not None else None
    if own is not None and own.is_file():
        theirs = spec_binding(audit_spec_doc(_load_spec(own)))
        mine = spec_binding(audit_spec_doc(spec))
        if theirs["sha256"] != mine["sha256"]:
            diffs = spec_differences(theirs["doc"], mine["doc"])
            problems.append(f"the claims name spec {own}, which differs from {what}: " + "; ".join(diffs[:8]))
    if problems:
        more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
        raise InputError(f"{what} cannot answer {len(problems)} claim(s) of {cf.source or '<claims>'}, so nothing "
                         f"was run: " + "; ".join(problems[:6]) + more)


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


def _spec_is_theirs(cf: ClaimsFile) -> bool:
    """True when the claims file's ``spec:`` lies inside the claims file's own directory tree (no link out).

    Such a spec came with the claims file the user named, and once it validated as an audit spec (its
    parse errors never quote it: circuitstat.pipelines.yamlio's echo rule) the errors of running its audit are shown in
    full: they quote spec values (a model source not built yet), not another file's text. Only a spec that
    --allow-outside let lie elsewhere keeps them withheld."""
    try:
        cf.spec_path(False)
    except InputError:
        return False
    return True


def _fix(spec_path: Path | None, run_dir: Path, source: str) -> str:
    """The fix for a run that a check cannot read: which audit makes it."""
    if spec_path is None:
        return (f"pass --run DIR of a finished audit (or tokens run), or run `circuitstat audit SPEC --out {run_dir}` "
                f"first (or give 'spec:' in {source} and pass --run-audit)")
    return (f"pass --run DIR of a finished audit, or --run-audit to run (or resume) the audit of {spec_path} into "
            f"{run_dir} first")


def check(claims: str | os.PathLike[str] | ClaimsFile, run: str | os.PathLike[str] | None = None,
          *, echo=None, allow_outside: bool = False, run_audit: bool = False, bind: bool = True,
          trust_unrecorded: bool = False) -> CheckReport:
    """Load the claims (InputError if malformed), find the run, evaluate every claim.

    `run` overrides the file's ``run:``. Without `run_audit` (``--run-audit``) a check only reads: a
    missing, unfinished or foreign run (an ``attribute`` run) is an InputError naming the problem and the
    fix, and nothing is written. With it, the audit of the file's ``spec:`` (circuitstat.pipelines.runs.audit.run.run_audit) runs
    into a new directory, or resumes an audit's run that is unfinished or lacks what a claim needs, after
    the spec was checked to contain everything the claims need. The file's ``run:`` and ``spec:`` must stay
    inside its directory tree unless `allow_outside` (``--allow-outside``). With `bind` (the default) a file whose
    ``spec:`` did not make the run is an InputError and a file without one gets a note (:mod:`.binding`); the
    service, which checks the claims against the job it names, passes False. `trust_unrecorded`
    (``--trust-unrecorded``) reads tables the run has no record of (circuitstat.core.run_check).
    """
    cf = claims if isinstance(claims, ClaimsFile) else load_claims(claims)
    source = cf.source or "<claims>"
    spec_path = cf.spec_path(allow_outside)
    file_run = cf.run_path(allow_outside)  # checked even when --run overrides it: a bad file is bad
    theirs = spec_path is not None and _spec_is_theirs(cf)
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
    if run_audit and spec is None:
        raise InputError(f"--run-audit runs the audit of the claims file's 'spec:', and {source} has none; "
                         "add 'spec: AUDIT.yaml' to it, or drop --run-audit")
    notes = _binding_notes(run_dir, spec, spec_path, source) if bind else []
    if not run_audit:
        report = _read_only(cf, run_dir, spec_path, source, trust_unrecorded)
    else:
        report = _with_audit(cf, run_dir, spec, spec_path, source, say=echo or (lambda msg: None), theirs=theirs)
    report.notes[:0] = notes
    return report


def _binding_notes(run_dir: Path, spec: Any, spec_path: Path | None, source: str) -> list[str]:
    """Notes on how the claims file is bound to the run; InputError when its spec did not make the run (issue 47)."""
    from circuitstat.core.rundir import MANIFEST, RunDir, RunDirError

    from .binding import BINDING_KEY, spec_binding, spec_differences

    if not (run_dir / MANIFEST).is_file():
        return []  # no run yet: the read-only check refuses it, --run-audit makes it from the spec
    try:
        manifest = RunDir.read_manifest(run_dir)
    except RunDirError as e:
        raise InputError(str(e)) from None
    rec = (manifest.get("provenance") or {}).get(BINDING_KEY)
    if spec is None:
        return [f"{source} names no 'spec:', so nothing ties its claims to the run {run_dir}; add 'spec: AUDIT.yaml' "
                "(the spec the run was made from) so that check refuses a run made from another spec"]
    if not isinstance(rec, dict) or not isinstance(rec.get("doc"), dict):
        return [f"the run {run_dir} records no spec binding (written before circuitstat recorded one, or not by "
                f"`circuitstat audit`), so check cannot tell whether {spec_path} made it; rerun the audit to bind them"]
    from circuitstat.pipelines.runs.audit.run import audit_spec_doc  # torch-free

    want = spec_binding(audit_spec_doc(spec))
    if want["sha256"] == rec.get("sha256"):
        return []
    diffs = spec_differences(want["doc"], rec["doc"]) or ["the recorded hashes differ"]
    more = f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""
    raise InputError(f"the run {run_dir} was not made from {spec_path} (the spec named by 'spec:' in {source}): "
                     f"{'; '.join(diffs[:8])}{more}; pass --run DIR of the run made from it, or make one with "
                     f"`circuitstat audit {spec_path} --out DIR`")


def _read_only(cf: ClaimsFile, run_dir: Path, spec_path: Path | None, source: str,
               trust_unrecorded: bool = False) -> CheckReport:
    """The check of a finished run, writing nothing; InputError when ``run_dir`` is none."""
    from .runkind import audit_target_problem, finished_run_problem

    problem = finished_run_problem(run_dir)
    if problem is not None:
        foreign = run_dir.is_dir() and audit_target_problem(run_dir) is not None
        fix = "pass --run DIR of a finished audit (or tokens run)" if foreign else _fix(spec_path, run_dir, source)
        raise InputError(f"{problem}; check reads a finished run and writes nothing: {fix}")
    report = CheckReport(evaluate_claims(cf, run_dir, trust_unrecorded=trust_unrecorded), run_dir, source)
    if any(r.missing and r.claim.kind not in TOKEN_KINDS for r in report.results):
        report.notes.append(f"pass --run-audit to let check run the audit of {spec_path} into {run_dir} for the "
                            "claims it cannot answer yet" if spec_path is not None else
                            f"give 'spec:' in {source} and pass --run-audit to let check run the audit these claims need")
    return report


def _with_audit(cf: ClaimsFile, run_dir: Path, spec: Any, spec_path: Path, source: str, *, say,
                theirs: bool) -> CheckReport:
    """The check with ``--run-audit``: the audit runs (or resumes) only when the run is missing, unfinished or
    lacks what a claim needs, only into a new directory or an audit's run, and only if it can answer every claim."""
    from circuitstat.core.lock import RunLockedError
    from circuitstat.core.rundir import RunDirError

    from .runkind import audit_target_problem, finished_run_problem

    target = audit_target_problem(run_dir)
    if target is not None:
        raise InputError(f"{target}; --run-audit writes an audit only into a new directory or an audit's run: "
                         "pass --run DIR of one of those")
    report = CheckReport([], run_dir, source)
    if finished_run_problem(run_dir) is None:
        report.results = evaluate_claims(cf, run_dir)
        if not any(r.missing for r in report.results):
            return report
    problems = {i: p for i, c in enumerate(cf.claims) if (p := spec_problem(c, spec))}
    if problems:
        report.results = _unanswerable(cf, report.results, problems, spec_path)
        return report

    from circuitstat.pipelines.kinds import kind  # the audit's module is heavy (torch); only when an audit is needed

    say(f"running the audit of {spec_path} into {run_dir} ...")
    try:
        kind("audit").run(spec, run_dir)  # as `circuitstat audit` and the service run it
    except Exception as e:  # noqa: BLE001 - errors from building its model or task may quote the spec's values
        if theirs and isinstance(e, (InputError, RunDirError, RunLockedError, OSError)):
            raise InputError(f"running the audit of {spec_path}: {e}") from None
        message = redacted_failure(e, f"the spec named by 'spec:' in {source}",
                                   f"circuitstat audit {spec_path} --out DIR")
        if message is None:
            raise
        raise InputError(message) from None
    report.ran_audit = True
    report.results = evaluate_claims(cf, run_dir)
    return report


def _unanswerable(cf: ClaimsFile, results: list[ClaimResult], problems: dict[int, str],
                  spec_path: Path) -> list[ClaimResult]:
    """The results with each claim the spec cannot answer (``problems``) an error saying why, and the claims
    left unevaluated because the audit was therefore not run an error saying so."""
    fresh = not results  # no run to evaluate on: every claim is unevaluated
    results = results or [ClaimResult(i, c, c.label(i), "pass", {}, bound_text(c), "", False)
                          for i, c in enumerate(cf.claims)]
    out = []
    for r in results:
        if r.index in problems:
            out.append(ClaimResult(r.index, r.claim, r.name, "error", r.observed, r.bound,
                                   f"the audit of {spec_path} cannot answer this claim: {problems[r.index]}", True))
        elif fresh or r.missing:
            out.append(ClaimResult(r.index, r.claim, r.name, "error", r.observed, r.bound,
                                   (r.reason + "; " if r.reason else "") + "not evaluated: the audit was not run "
                                   "because the spec cannot answer other claims", True))
        else:
            out.append(r)
    return out
