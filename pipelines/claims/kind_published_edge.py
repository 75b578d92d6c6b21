"""Claim kind ``published_edge``: a bound on one edge of a published circuit audited on this run (spec key
``circuit``; docs/mib.md) -- its BH q-value, the ends of its effect's interval, or how often it enters the
top-k circuits of the circuit's size over resamples (table published_circuit_edges).

``published_circuit`` bounds the circuit as a whole (its faithfulness, its share of unsupported edges); this kind
names the edge a paper leans on: "a0.h3 -> a1.h5<k> of our circuit is supported, q <= 0.05" or "... is in the
top-k in at least 80% of resamples". The interval and q-value are edge_stats' own (the audit copies them), so a
bound on them is refused where edge_stats flags that a few prompts carry the edge's mean (no_tail_seen false),
as edge_effect refuses it.

The kind is this module (its model and evaluator) and one entry in the registry (kinds.py), which adds what the
audit must compute to answer it (a published circuit and the method: requirements.published_circuit) and the hint
of a run without its table.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from ..spec import METHOD
from .bounds import bounded, fmt
from .models import BoundedClaim, EdgeName, claimable_in
from .reader import ClaimError, RunReader, edge_known, need, require_no_tail_seen, scalar

__all__ = ["PublishedEdgeClaim", "evaluate_published_edge"]


class PublishedEdgeClaim(BoundedClaim):
    """A bound on a statistic of one edge of the published circuit the audit checked (spec key ``circuit``), for
    ``method``'s scores: q (supported at that q), ci_low / ci_high of its mean effect, or inclusion."""

    kind: Literal["published_edge"]
    TABLES: ClassVar[tuple[str, ...]] = ("published_circuit_edges",)
    edge: EdgeName
    method: METHOD
    statistic: Literal[claimable_in(TABLES)]

    def _auto_label(self) -> str:
        return f"{self.edge} {self.method} {self.statistic}"


def evaluate_published_edge(c: PublishedEdgeClaim, run: RunReader) -> tuple[bool, dict, str]:
    """Return (holds, observed, reason) of a published_edge claim on ``run``: the edge's statistic against its bounds."""
    need(run, c.table, "method", c.method, "add it to the spec's methods (and give the spec a circuit: key)")
    edge_known(run, c.edge)
    cols = ["estimate", "ci_low", "ci_high", "q", "inclusion"]
    rows = run.rows(c.table, cols, method=c.method, name=c.edge)
    if not rows:
        edges = run.distinct(c.table, "name", method=c.method)
        raise ClaimError(f"edge {c.edge!r} is not an edge of the published circuit (its {len(edges)} edges: "
                         f"{', '.join(edges[:8])}{', ...' if len(edges) > 8 else ''}); check the claim's edge")
    where = f"{c.edge} ({c.method}, published circuit)"
    if c.statistic != "inclusion":  # edge_stats' interval and q-value: refused where a few prompts carry the mean
        require_no_tail_seen(run, "edge_stats", "ci_low", where, method=c.method, name=c.edge)
    v = scalar(run, c.table, c.statistic, where, method=c.method, name=c.edge)
    ok, reason = bounded(v, c, f"{c.statistic} of {where}")
    r = rows[0]
    detail = (f"mean effect {fmt(r['estimate'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}], q = {fmt(r['q'])}, "
              f"inclusion {fmt(r['inclusion'])}")
    return ok, {c.statistic: v}, f"{reason} ({detail})"

