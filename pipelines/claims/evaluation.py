"""Evaluating claims against a run directory: one ClaimResult (pass, fail or error, with the
observed values, the bound and the reason) per claim; one claim's error never stops the others."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from circuitstat.core.errors import InputError

from .bounds import fmt
from .claimsfile import ClaimsFile
from .kinds import KINDS, TABLE_HINTS, bound_text
from .reader import ClaimError, RunReader

__all__ = ["ClaimResult", "evaluate_claims"]


@dataclass
class ClaimResult:
    """The outcome of one claim."""

    index: int
    claim: Any
    name: str
    status: Literal["pass", "fail", "error"]
    observed: dict[str, Any]
    bound: str
    reason: str
    missing: bool = False  # an error that running the audit (with a suitable spec) could fix
    seconds: float = 0.0

    @property
    def observed_text(self) -> str:
        """Return the observed value(s) as the results print them ("-" when there are none)."""
        if not self.observed:
            return "-"
        if len(self.observed) == 1:
            return fmt(next(iter(self.observed.values())))
        return ", ".join(f"{k}={fmt(v)}" for k, v in self.observed.items())

    def to_dict(self) -> dict[str, Any]:
        """Return the result as a JSON-ready dict: name, kind, status, observed, bound, reason, description."""
        return {"name": self.name, "kind": self.claim.kind, "status": self.status, "observed": self.observed,
                "bound": self.bound, "reason": self.reason,
                "description": getattr(self.claim, "description", None)}


def evaluate_claims(claims: ClaimsFile | list, run_dir: str | os.PathLike[str], *,
                    trust_unrecorded: bool = False) -> list[ClaimResult]:
    """Evaluate every claim against the run directory `run_dir`; never raises for a single claim.

    Raises InputError only when `run_dir` is not a readable run directory, or its tables are not the ones
    it recorded (circuitstat.core.run_check; ``trust_unrecorded`` reads tables it has no record of).
    """
    from circuitstat.core.rundir import RunDirError
    from circuitstat.core.run_check import verify_outputs

    items = claims.claims if isinstance(claims, ClaimsFile) else list(claims)
    path = Path(run_dir)
    if not path.is_dir():
        raise InputError(f"run directory {path} does not exist")
    verify_outputs(path, trust_unrecorded=trust_unrecorded)  # a claim is checked against the tables the run wrote, not edited ones
    try:
        run = RunReader(path, TABLE_HINTS)
    except RunDirError as e:
        raise InputError(str(e)) from None
    if run.manifest is None and not any(path.glob("*.parquet")):
        raise InputError(f"{path} is not a run directory (no manifest.json and no Parquet tables)")
    results = []
    for i, c in enumerate(items):
        t0 = time.perf_counter()
        try:
            ok, obs, reason = KINDS[c.kind].evaluate(c, run)
            status, missing = ("pass" if ok else "fail"), False
        except ClaimError as e:
            status, obs, reason, missing = "error", e.observed, e.reason, e.missing
        except Exception as e:  # a table of unexpected shape or type: report it on this claim only
            status, obs, missing = "error", {}, False
            reason = f"cannot be evaluated on this run ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        results.append(ClaimResult(i, c, c.label(i), status, obs, bound_text(c), reason, missing,
                                   time.perf_counter() - t0))
    return results
