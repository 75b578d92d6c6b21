"""Evaluation of each claim kind against a run: one function per kind, each returning
(holds, observed values, reason) or raising ClaimError with what the run lacks and the fix.

Every evaluator reads its kind's own table as ``c.table`` (declared once, as its model's ``TABLES``); the registry
(circuitstat.pipelines.claims.kinds) names each kind's evaluator.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from circuitstat.core.schema import DANGLING_REASON, claimable

from .bounds import bounded, cmp_text, fmt
from .models import (ApproximationClaim, CircuitStabilityClaim, EdgeEffectClaim, EdgeInCircuitClaim, FaithfulnessClaim,
                     HeadStabilityClaim, LayerStabilityClaim, MissedEdgesClaim, PublishedCircuitClaim, SinkClaim, VerifiedEdgeClaim, SinkStabilityClaim, TokenDropClaim,
                     TokenImportanceClaim, TokenStabilityClaim, model_label)
from .reader import ClaimError, RunReader, edge_known, need, require_no_tail_seen, scalar, token_part

__all__ = ["EDGE_EFFECT_COLUMNS", "effect_size", "evaluate_edge_in_circuit", "evaluate_circuit_stability",
           "evaluate_faithfulness", "evaluate_edge_effect", "evaluate_head_stability", "evaluate_layer_stability",
           "evaluate_approximation", "evaluate_verified_edge", "evaluate_missed_edges", "evaluate_published_circuit",
           "evaluate_sink", "evaluate_token_drop", "evaluate_token_importance", "evaluate_sink_stability",
           "evaluate_token_stability", "evaluate_circuit_test"]

_FIX_METHOD = "add it to the spec's methods"


def evaluate_edge_in_circuit(c: EdgeInCircuitClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of an edge_in_circuit claim on ``run``: the edge's inclusion frequency in the
    top-k circuit against min_inclusion."""
    need(run, c.table, "method", c.method, _FIX_METHOD)
    need(run, c.table, "k", c.k, "", method=c.method)
    edge_known(run, c.edge)
    rows = run.rows(c.table, ["frequency"], method=c.method, k=c.k, name=c.edge)
    freq = float(rows[0]["frequency"]) if rows else 0.0  # no row: never in the top-k circuit
    if math.isnan(freq):
        raise ClaimError(f"inclusion of {c.edge} at k={c.k} for {c.method} is NaN in the run")
    label = f"inclusion of {c.edge} in the top-{c.k} circuit for {c.method}"
    if not rows:
        label += " (never selected)"
    ok = freq >= c.min_inclusion
    return ok, {"inclusion": freq}, f"{label} is {cmp_text(freq, c.min_inclusion, '>=' if ok else '<')}"


def evaluate_circuit_stability(c: CircuitStabilityClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a circuit_stability claim on ``run``: a stability statistic of the top-k
    circuit against its bounds."""
    need(run, c.table, "method", c.method, _FIX_METHOD)
    need(run, c.table, "k", c.k, "", method=c.method)
    v = scalar(run, c.table, c.statistic, f"{c.method} k={c.k}", method=c.method, k=c.k)
    ok, reason = bounded(v, c, f"{c.statistic} at k={c.k} for {c.method}")
    return ok, {c.statistic: v}, reason


def evaluate_faithfulness(c: FaithfulnessClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a faithfulness claim on ``run``: a faithfulness statistic (per k, or
    CPR/CMD) against its bounds."""
    need(run, c.table, "method", c.method, _FIX_METHOD)
    eq: dict[str, Any] = {"method": c.method}
    if c.k is not None:
        need(run, c.table, "k", c.k, "", method=c.method)
        eq["k"] = c.k
    v = scalar(run, c.table, c.statistic, " ".join(f"{a}={b}" for a, b in eq.items()), **eq)
    where = f" at k={c.k}" if c.k is not None else ""
    ok, reason = bounded(v, c, f"{c.statistic}{where} for {c.method}")
    return ok, {c.statistic: v}, reason + fieller_reason(c.statistic, c.table, run, eq)


def fieller_reason(statistic: str, table: str, run: RunReader, eq: dict[str, Any]) -> str:
    """Return ' (the Fieller note)' when a bound on f_ci_* reads a row whose Fieller set is unbounded, else ''."""
    if not statistic.startswith("f_ci_") or "f_ci_note" not in run.table(table, []).column_names:
        return ""
    notes = [r["f_ci_note"] for r in run.rows(table, ["f_ci_note"], **eq) if r["f_ci_note"]]
    return f" ({notes[0]})" if notes else ""  # Fieller's set is unbounded: say why the end is infinite


#: edge_effect's estimand -> its (estimate, ci_low, ci_high, q) columns in edge_stats
EDGE_EFFECT_COLUMNS = {"mean": ("estimate", "ci_low", "ci_high", "q"),
                       "median": ("median", "median_ci_low", "median_ci_high", "median_q"),
                       "trimmed_mean": ("trimmed_mean", "trimmed_mean_ci_low", "trimmed_mean_ci_high", "trimmed_mean_q")}


def evaluate_edge_effect(c: EdgeEffectClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of an edge_effect claim on ``run``: the edge's effect: its sign, BH q-value and
    (optionally) size."""
    need(run, c.table, "method", c.method, _FIX_METHOD)
    edge_known(run, c.edge)
    cols = EDGE_EFFECT_COLUMNS[c.estimand]
    if not set(cols) <= set(run.table(c.table, []).column_names):
        raise ClaimError(f"the run's {c.table} has no {c.estimand} columns (it predates the robust estimands); "
                         "re-run the audit to claim the edge's " + c.estimand.replace("_", " "))
    rows = run.rows(c.table, list(cols), method=c.method, name=c.edge)
    if not rows:
        raise ClaimError(f"edge {c.edge!r} has no row in {c.table}.parquet for {c.method}; re-run the audit", missing=True)
    if c.estimand == "mean":
        # the q-value inverts the interval: an interval a few prompts carry cannot back a significance claim (the
        # robust estimands' intervals do not rest on the few prompts that flag rests on)
        require_no_tail_seen(run, c.table, "ci_low", f"{c.edge} ({c.method})", method=c.method, name=c.edge)
    r = rows[0]
    est, q = r[cols[0]], r[cols[3]]
    obs = {"estimate": est, "q": q, "ci_low": r[cols[1]], "ci_high": r[cols[2]]}
    if est is None or q is None or math.isnan(est) or math.isnan(q):
        note = "; ".join(sorted({str(x["robust_note"]) for x in run.rows(c.table, ["robust_note"], method=c.method,
                                                                            name=c.edge) if x.get("robust_note")})
                         ) if c.estimand != "mean" else ""
        raise ClaimError(f"the {c.estimand.replace('_', ' ')} or q-value of {c.edge} for {c.method} is undefined (NaN) "
                         f"in the run" + (f": {note}" if note else ""), observed=obs)
    sign_ok = {"positive": est > 0, "negative": est < 0, "nonzero": est != 0}[c.sign]
    what = "estimate" if c.estimand == "mean" else c.estimand.replace("_", " ")
    label = f"{c.edge} ({c.method}): {what} {fmt(est)} [{fmt(obs['ci_low'])}, {fmt(obs['ci_high'])}]"
    if not sign_ok:
        return False, obs, f"{label} is not {c.sign}"
    floor = _at_p_floor(run, c.table, method=c.method, name=c.edge) if c.estimand == "mean" else ""
    if q > c.max_q:
        return False, obs, f"{label}, q = {cmp_text(q, c.max_q, '>')}: not significant after BH{floor}"
    size = ""
    if c.min_abs is not None:
        mag, what = effect_size(est, obs["ci_low"], obs["ci_high"], c.sign, c.min_abs_of)
        if mag < c.min_abs:
            return False, obs, f"{label}: {what} {cmp_text(mag, c.min_abs, '<')}, below the claimed effect size"
        size = f", {what} {cmp_text(mag, c.min_abs, '>=')}"
    return True, obs, f"{label} is {c.sign}, q = {cmp_text(q, c.max_q, '<=')}{size}{floor}"


def effect_size(est: float, low: float, high: float, sign: str, of: str) -> tuple[float, str]:
    """Return (the effect size a min_abs bound reads, its words): |estimate|, or the interval's end nearer 0 in the
    claimed direction (0 when the interval holds 0 or lies on the other side)."""
    if of == "estimate":
        return abs(est), "|estimate|"
    inner = {"positive": low, "negative": -high}.get(sign, max(low, -high))
    return max(float(inner), 0.0), "the interval's inner end (in size)"


def _at_p_floor(run: RunReader, table: str, **eq) -> str:
    """'' or a note that the edge's p-value sits at its resampling floor 1/(B+1), so B sets its q-value."""
    if not {"p", "p_floor"} <= set(run.table(table, []).column_names):
        return ""  # a run from before edge_stats recorded the floor
    r = run.rows(table, ["p", "p_floor"], **eq)[0]
    p, f = r["p"], r["p_floor"]
    if p is None or f is None or not f > 0 or math.isnan(p) or p > f * (1 + 1e-9):
        return ""
    return f" (its p-value sits at the resampling floor 1/(B+1) = 1/{round(1 / f):,}: the resample count sets q)"


def evaluate_head_stability(c: HeadStabilityClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a head_stability claim: a head's stability statistic against its bounds."""
    cols = [c.statistic]
    if not run.rows(c.table, cols, layer=c.layer, head=c.head):
        layers = run.distinct(c.table, "layer")
        heads = run.distinct(c.table, "head")
        raise ClaimError(f"head a{c.layer}.h{c.head} is not in the run's {c.table} table "
                         f"(layers {layers}, heads {heads}); check the claim's layer and head")
    eq: dict[str, Any] = {"layer": c.layer, "head": c.head}
    for key in ("match", "pairs"):
        val = getattr(c, key)
        if val is not None:
            need(run, c.table, key, val, f"set heads.{key}: {val} in the spec")
            eq[key] = val
    v = scalar(run, c.table, c.statistic, f"head a{c.layer}.h{c.head}", **eq)
    ok, reason = bounded(v, c, f"{c.statistic} of head a{c.layer}.h{c.head}")
    return ok, {c.statistic: v}, reason


def evaluate_layer_stability(c: LayerStabilityClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a layer_stability claim: a layer's stability statistic against its
    bounds."""
    if not run.rows(c.table, [c.statistic], layer=c.layer):
        raise ClaimError(f"layer {c.layer} is not in the run's {c.table} table (layers {run.distinct(c.table, 'layer')}); "
                         "check the claim's layer")
    v = scalar(run, c.table, c.statistic, f"layer {c.layer}", layer=c.layer)
    ok, reason = bounded(v, c, f"{c.statistic} of layer {c.layer}")
    return ok, {c.statistic: v}, reason


def evaluate_approximation(c: ApproximationClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of an approximation claim on ``run``: an approximation's agreement with exact
    against its bounds."""
    need(run, c.table, "method", c.method, "add it and 'exact' to the spec's methods")
    eq: dict[str, Any] = {"method": c.method}
    if c.k is not None:
        need(run, c.table, "k", c.k, "", method=c.method)
        eq["k"] = c.k
    try:
        v = scalar(run, c.table, c.statistic, f"{c.method}", **eq)
    except ClaimError as e:
        if "different values" in e.reason:
            ks = run.distinct(c.table, "k", method=c.method)
            raise ClaimError(f"{c.statistic} of {c.method} differs by k; give 'k' (one of {ks})") from None
        raise
    where = f" (top-{c.k})" if c.k is not None else ""
    ok, reason = bounded(v, c, f"{c.statistic}{where} of {c.method} against exact")
    return ok, {c.statistic: v}, reason


_FIX_VERIFY = "add it to the spec's methods with verify: {n: 16} (or run attribute --verify)"


def evaluate_verified_edge(c: VerifiedEdgeClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a verified_edge claim: an edge's verified statistic against its bounds."""
    need(run, c.table, "method", c.method, _FIX_VERIFY)
    edge_known(run, c.edge)
    cols = ["estimate", "ci_low", "ci_high", "qvalue", "estimand", "no_tail_seen"]
    rows = run.rows(c.table, cols, method=c.method, edge_name=c.edge)
    if not rows:
        raise ClaimError(f"edge {c.edge!r} was not verified for {c.method} (verify.edges verifies the top candidates "
                         "and a random sample); verify every edge (drop verify.edges) or raise verify.edges.top",
                         missing=True)
    # the q-value inverts the interval: an interval a few prompts carry cannot back a bound on either
    stat = "ci_low" if c.statistic == "qvalue" else c.statistic
    require_no_tail_seen(run, c.table, stat, f"{c.edge} ({c.method}, verified)", method=c.method, edge_name=c.edge)
    v = scalar(run, c.table, c.statistic, f"{c.edge} ({c.method})", method=c.method, edge_name=c.edge)
    r = rows[0]
    ok, reason = bounded(v, c, f"{c.statistic} of {c.edge} ({c.method})")
    detail = f"{r['estimand']}: {fmt(r['estimate'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}], q = {fmt(r['qvalue'])}"
    if r["no_tail_seen"] is None:  # an active-design run made before its flag was built (stats/verified/active_flag.py)
        detail += "; no_tail_seen not assessed"
    return ok, {c.statistic: v}, f"{reason} ({detail})"


def evaluate_missed_edges(c: MissedEdgesClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a missed_edges claim on ``run``: the missed-edges bound of a verified run
    against its bounds."""
    need(run, c.table, "method", c.method, "verify it with verify: {n: 16, edges: {top: m, random: r}, tau: t}")
    v = scalar(run, c.table, c.statistic, f"{c.method}", method=c.method)
    (r,) = run.rows(c.table, ["tau", "level", "n_unverified"], method=c.method)
    what = (f"summed |mean exact effect| of {c.method}'s unverified edges" if c.statistic.startswith("mass_") else
            f"unverified edges of {c.method} with |mean exact effect| > {fmt(r['tau'])}")
    ok, reason = bounded(v, c, f"{c.statistic} ({what})")
    return ok, {c.statistic: v}, f"{reason} (of {r['n_unverified']} unverified edges, at level {fmt(r['level'])})"


def evaluate_published_circuit(c: PublishedCircuitClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a published_circuit claim on ``run``: a statistic of the published circuit
    against its bounds."""
    need(run, c.table, "method", c.method, "add it to the spec's methods (and give the spec a circuit: key)")
    v = scalar(run, c.table, c.statistic, c.method, method=c.method)
    ok, reason = bounded(v, c, f"{c.statistic} of the published circuit ({c.method})")
    return ok, {c.statistic: v}, reason + fieller_reason(c.statistic, c.table, run, {"method": c.method})


def evaluate_sink(c: SinkClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a sink claim: a head's sink statistic against its bounds."""
    part = run.part(c.model, c.table)
    node = f"a{c.layer}.h{c.head}"
    if not part.rows(c.table, ["node"], layer=c.layer, head=c.head):
        nodes = part.distinct(c.table, "node")
        close = difflib.get_close_matches(node, nodes, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "check the claim's head"
        raise ClaimError(f"head {node} is not in the run's {c.table} (layers {part.distinct(c.table, 'layer')}, "
                         f"heads {part.distinct(c.table, 'head')}); {hint}")
    where = node + model_label(c.model)
    v = scalar(part, c.table, c.statistic, where, layer=c.layer, head=c.head)
    require_no_tail_seen(part, c.table, c.statistic, f"the sink rate of {where}", layer=c.layer, head=c.head)
    (r,) = part.rows(c.table, ["sink_rate", "ci_low", "ci_high", "threshold"], layer=c.layer, head=c.head)
    ok, reason = bounded(v, c, f"{c.statistic} of {where}")
    rate = f"sink rate {fmt(r['sink_rate'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}] above {fmt(r['threshold'])}"
    return ok, {c.statistic: v}, f"{reason} ({rate})"


def evaluate_token_drop(c: TokenDropClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a token_drop claim: a token-ablation drop statistic against its bounds."""
    part = token_part(run, c.model, c.table, c.k, [c.measure])
    where = f"the metric drop from ablating {c.measure}'s top-{c.k} tokens" + model_label(c.model)
    v = scalar(part, c.table, c.statistic, where, measure=c.measure, k=c.k)
    require_no_tail_seen(part, c.table, c.statistic, where, measure=c.measure, k=c.k)
    ok, reason = bounded(v, c, f"{c.statistic} of {where}")
    return ok, {c.statistic: v}, reason


def evaluate_token_importance(c: TokenImportanceClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a token_importance claim on ``run``: the Holm verdict that measure_a's
    tokens matter more than measure_b's."""
    a, b = c.measure_a, c.measure_b
    part = token_part(run, c.model, c.table, c.k, [a, b], ("measure_a", "measure_b"))
    cols = ["difference", "ci_low", "ci_high", "pvalue_holm", "verdict", "interval_reliable", "multiplicity"]
    sign, rows = 1.0, part.rows(c.table, cols, measure_a=a, measure_b=b, k=c.k)
    if not rows:  # the run tested b - a: the same verdict, read the other way round
        sign, rows = -1.0, part.rows(c.table, cols, measure_a=b, measure_b=a, k=c.k)
    if not rows:
        raise ClaimError(f"the run did not test {a} against {b} (its --pairs left them out); "
                         f"rerun `circuitstat tokens` with --pairs including {a}:{b}")
    r = rows[0]
    d, lo, hi = (sign * r["difference"], *sorted((sign * r["ci_low"], sign * r["ci_high"])))
    obs = {"difference": d, "ci_low": lo, "ci_high": hi, "pvalue_holm": r["pvalue_holm"]}
    what = f"drop {a} - {b} at k={c.k}{model_label(c.model)}"
    if r["interval_reliable"] is False:
        raise ClaimError(f"the interval of {what} is flagged unreliable in {c.table} (a few prompts "
                         "carry the difference), so its verdict cannot back this claim; rerun with more prompts (--n)",
                         observed=obs)
    verdict = r["verdict"]
    if sign < 0 and verdict != "inconclusive":  # the row's 'b < a' is the claim's 'a > b'
        verdict = f"{a} > {b}" if verdict == f"{b} < {a}" else f"{a} < {b}"
    holds = verdict == f"{a} > {b}"
    text = (f"{what}: {fmt(d)} [{fmt(lo)}, {fmt(hi)}], Holm p = {fmt(r['pvalue_holm'])}: verdict "
            f"{verdict!r} ({r['multiplicity']})")
    return holds, obs, text if holds else f"{text}, not '{a} > {b}'"


def evaluate_sink_stability(c: SinkStabilityClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a sink_stability claim on ``run``: an item of sink_stability or
    sink_matching against its bounds."""
    from circuitstat.stats.sink_matching import ITEMS as MATCHED_ITEMS

    plain, matched = c.tables  # sink_stability, sink_matching: an item of either
    table = matched if c.item in MATCHED_ITEMS else plain
    items = run.distinct(table, "item", layer=c.layer)
    if not items:
        raise ClaimError(f"layer {c.layer} is not in the run's {table} (layers "
                         f"{run.distinct(table, 'layer')}; -1 is the whole model)")
    if c.item not in items:
        also = f"; or one of {list(MATCHED_ITEMS)} ({matched})" if table == plain else ""
        raise ClaimError(f"item {c.item!r} is not in the run's {table} for layer {c.layer} (items: {items}{also})")
    if c.statistic not in claimable(table):
        raise ClaimError(f"{c.statistic} is not a column of {table} (claimable: {', '.join(claimable(table))})")
    where = f"{c.item} of layer {c.layer}" if c.layer >= 0 else c.item
    v = scalar(run, table, c.statistic, where, layer=c.layer, item=c.item)
    (r,) = run.rows(table, ["value", "ci_low", "ci_high", "n_refits"], layer=c.layer, item=c.item)
    ok, reason = bounded(v, c, f"{c.statistic} of {where}")
    detail = f"mean over {r['n_refits']} seeds {fmt(r['value'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"
    if table == matched:
        (m,) = run.rows(table, ["null", "verdict", "matching"], layer=c.layer, item=c.item)
        detail = (f"mean over ordered pairs of {r['n_refits']} seeds {fmt(r['value'])} [{fmt(r['ci_low'])}, "
                  f"{fmt(r['ci_high'])}], random matching {fmt(m['null'])}, verdict {m['verdict']!r}; heads matched "
                  f"by {m['matching']}")
    return ok, {c.statistic: v}, f"{reason} ({detail})"


def evaluate_token_stability(c: TokenStabilityClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a token_stability claim on ``run``: the seeds' top-k token agreement
    against its bounds."""
    part = token_part(run, None, c.table, c.k, [c.measure])
    where = f"the top-{c.k} {c.measure} token Jaccard between seeds"
    v = scalar(part, c.table, c.statistic, where, measure=c.measure, k=c.k)
    (r,) = part.rows(c.table, ["jaccard", "chance"], measure=c.measure, k=c.k)
    ok, reason = bounded(v, c, f"{c.statistic} of {where}")
    return ok, {c.statistic: v}, f"{reason} (Jaccard {fmt(r['jaccard'])}, chance {fmt(r['chance'])})"


def evaluate_circuit_test(c: Any, run: RunReader) -> tuple[bool, dict, str]:
    """A circuit test claim: the test's p-value against alpha (holds on rejection for sufficiency and partial
    necessity, on non-rejection for equivalence, independence and minimality)."""
    test, want_reject = c.TEST, c.WANT_REJECT
    methods = run.distinct(c.table, "method")
    method = c.method
    if method is None:
        if len(methods) != 1:
            raise ClaimError(f"the run tested circuits of {methods}; give the claim's 'method'")
        method = methods[0]
    need(run, c.table, "method", method, "set tests.method in the spec")
    cols = ["statistic", "pvalue", "n_test", "n_select", "k", "parameter", "rejection_means"]
    rows = run.rows(c.table, cols, method=method, test=test)
    if len(rows) != 1:
        raise ClaimError(f"the run's circuit_tests has {len(rows)} rows for {test} of {method}; re-run the audit",
                         missing=True)
    r = rows[0]
    p = float(r["pvalue"])
    if math.isnan(p):
        raise ClaimError(f"the {test} p-value of {method}'s circuit is NaN in the run")
    rejected = p <= c.alpha
    obs = {"pvalue": p, "statistic": r["statistic"]}
    where = (f"{test} of the {r['k']}-edge circuit ({method}) on {r['n_test']} testing prompts "
             f"(chosen on {r['n_select']} others)")
    text = f"{where}: p = {cmp_text(p, c.alpha, '<=' if rejected else '>')}"
    if c.kind == "circuit_minimal" and rejected:
        old_run = not run.has_column("circuit_minimality", "dangling")  # written before the column existed
        cols = ["name", "pvalue_adjusted", "correction"] + ([] if old_run else ["dangling"])
        edges = run.rows("circuit_minimality", cols, method=method)
        bad = sorted((e for e in edges if e["pvalue_adjusted"] <= c.alpha), key=lambda e: e["pvalue_adjusted"])
        text += (f"; redundant edges ({bad[0]['correction'] if bad else ''}): "
                 + ", ".join(f"{e['name']} (p = {fmt(e['pvalue_adjusted'])}{'; ' + DANGLING_REASON if e.get('dangling') else ''})"
                             for e in bad[:5]))
    if rejected:
        text += f": {r['rejection_means']}"
    elif not want_reject:
        text += ": not rejected (no evidence against it at this N; a pass is not proof)"
    return rejected == want_reject, obs, text
