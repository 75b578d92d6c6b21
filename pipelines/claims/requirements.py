"""What an audit must compute to answer a claim: each kind's ``requires(claim, spec)`` (kinds.py names one per kind).

Each returns None when the audit of ``spec`` answers the claim, else the reason and the fix. ``check --run-audit``
and ``check-circuit`` ask every claim before any work (issue 47: 186 s spent before a claim was found unanswerable).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PUBLISHED_HINT", "approximation", "faithfulness", "head_stability", "method_and_k", "missed_edges",
           "published_circuit", "several_seeds", "tests_stage", "tokens_run", "verified_edge", "verified_run"]

#: what makes the tables of a published circuit (the hint of a run that lacks them)
PUBLISHED_HINT = ("a published circuit is audited when the spec has 'circuit: {file: FILE}' "
                  "(or `circuitstat check-circuit`)")


def tokens_run(claim: Any, spec: Any) -> str | None:
    """Return why the audit cannot answer a token or sink claim (a ``circuitstat tokens`` run does)."""
    return (f"{claim.kind} claims are answered by `circuitstat tokens`, which the audit does not run; "
            "pass --run DIR of a tokens run")


def tests_stage(claim: Any, spec: Any) -> str | None:
    """Return None when the spec's tests stage tests the claim's circuit, else what to add."""
    tests = getattr(spec, "tests", None)
    if tests is None:
        return "circuit test claims need the audit's tests stage; add tests: {k: K} (or tests: {edges: [...]}) to the spec"
    tested = "given" if tests.edges is not None else (tests.method or list(spec.methods)[0])
    if claim.method is not None and claim.method != tested:
        return f"the spec's tests run on {tested!r}, not {claim.method!r}; set tests.method: {claim.method}"
    return None


def method_and_k(claim: Any, spec: Any) -> str | None:
    """Return None when the spec runs the claim's method (a ``+verified`` one: its approximation, verified on every
    edge) and its k, else what to add."""
    methods = list(spec.methods)
    method = getattr(claim, "method", None)
    verify = getattr(spec, "verify", None)
    if method is not None and method.endswith("+verified"):
        approx = method.removesuffix("+verified")
        if approx not in methods:
            return f"method {method!r} verifies {approx!r}, which is not in the spec's methods {methods}; add it"
        if verify is None or verify.edges is not None:
            return (f"{method} circuits need a verified run on every edge; add verify: {{n: 16}} without 'edges' to "
                    "the spec (docs/verified.md)")
        if verify.design == "active":
            return (f"{method} circuits are selected from the uniform design's pseudo-scores; the active design "
                    "writes none: use verify: {n: 16} (design: uniform) for them")
    elif method is not None and "+" in method:  # several approximations verified together (verify.combine)
        from circuitstat.pipelines.verify import combined_method

        combine = getattr(verify, "combine", None)
        if combine is None or combined_method(combine) != method:
            return (f"method {method!r} is the rows of several methods verified together; add verify: {{n: 16, "
                    f"combine: [{', '.join(method.split('+'))}]}} (each in the spec's methods) to the spec")
    elif method is not None and method not in methods:
        return f"method {method!r} is not in the spec's methods {methods}; add it"
    k = getattr(claim, "k", None)
    if k is not None and k not in spec.k:
        return f"k={k} is not in the spec's k {list(spec.k)}; add it to the spec's k"
    return None


def approximation(claim: Any, spec: Any) -> str | None:
    """Return None when the spec runs the claim's method and exact (its k is top_k_overlap's, not a circuit size)."""
    methods = list(spec.methods)
    if claim.method not in methods:
        extra = " and 'exact'" if "exact" not in methods else ""
        return f"method {claim.method!r} is not in the spec's methods {methods}; add it{extra}"
    if "exact" not in methods:
        return f"approximation is measured against 'exact', which is not in the spec's methods {methods}; add it"
    return None


def faithfulness(claim: Any, spec: Any) -> str | None:
    """Return None when the spec runs the claim's method and k and measures faithfulness."""
    if (problem := method_and_k(claim, spec)) is not None:
        return problem
    return None if spec.faithfulness else "the spec has 'faithfulness: false'; set it to true"


def verified_run(claim: Any, spec: Any) -> str | None:
    """Return None when the spec verifies its methods (spec key ``verify``)."""
    if getattr(spec, "verify", None) is None:
        return "verified claims need a verified run; add verify: {n: 16} to the spec (docs/verified.md)"
    return None


def verified_edge(claim: Any, spec: Any) -> str | None:
    """Return None when the spec runs and verifies the claim's method."""
    return method_and_k(claim, spec) or verified_run(claim, spec)


def missed_edges(claim: Any, spec: Any) -> str | None:
    """Return None when the spec verifies the claim's method on an edge subset (the missed-edges bound needs one)."""
    if (problem := verified_edge(claim, spec)) is not None:
        return problem
    if spec.verify.edges is None:
        return ("missed_edges claims need an edge subset; add edges: {top: m, random: r} and tau to the spec's "
                "verify")
    return None


def published_circuit(claim: Any, spec: Any) -> str | None:
    """Return None when the spec runs the claim's method and audits a published circuit (spec key ``circuit``)."""
    if (problem := method_and_k(claim, spec)) is not None:
        return problem
    if getattr(spec, "circuit", None) is None:
        return (f"{claim.kind} claims need a published circuit; add circuit: {{file: FILE}} to the spec "
                "(docs/mib.md)")
    return None


def several_seeds(claim: Any, spec: Any) -> str | None:
    """Return None when the spec lists several seeds (head and layer stability compare them)."""
    if len(spec.sources) < 2:
        return "head stability needs several seeds; list two or more models under 'models:' in the spec"
    return None


def head_stability(claim: Any, spec: Any) -> str | None:
    """Return None when the spec lists several seeds and matches heads as the claim asks."""
    if (problem := several_seeds(claim, spec)) is not None:
        return problem
    for key in ("match", "pairs"):
        want = getattr(claim, key)
        if want is not None and getattr(spec.heads, key) != want:
            return f"the claim asks for {key}={want!r} but the spec has heads.{key}: {getattr(spec.heads, key)}"
    return None
