"""The registry of claim kinds: each kind's ``kind:`` name, the run table(s) that answer it, and which run writes them.

This is the one place a kind names its tables. The claim models take the statistics a kind accepts
from here (the columns core/schema.py marks claimable in those tables), and the evaluators read
the same tables through the claim (``claim.table``), so a kind's model and its evaluation cannot
name different tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from circuitstat.core.schema import claimable

__all__ = ["ClaimKind", "KINDS", "CLAIM_KINDS", "TOKEN_KINDS", "CIRCUIT_TESTS", "statistics"]


@dataclass(frozen=True)
class ClaimKind:
    """One kind of claim: its name in a claims file, the run tables it is answered from and the run writing them."""

    name: str
    #: the tables the claim is read from; its ``statistic`` (when it has one) is a claimable column of one of them
    tables: tuple[str, ...]
    #: "audit" (``circuitstat audit`` / ``check`` with a spec) or "tokens" (``circuitstat tokens``)
    answered_by: Literal["audit", "tokens"] = "audit"

    @property
    def table(self) -> str:
        """Return the kind's own table (the first of ``tables``)."""
        return self.tables[0]

    @property
    def statistics(self) -> tuple[str, ...]:
        """Return the claimable columns of the kind's tables, in schema order, each once."""
        return tuple(dict.fromkeys(c for t in self.tables for c in claimable(t)))


KINDS: dict[str, ClaimKind] = {k.name: k for k in (
    ClaimKind("edge_in_circuit", ("inclusion",)),
    ClaimKind("circuit_stability", ("stability_vs_k",)),
    ClaimKind("faithfulness", ("faithfulness_vs_k",)),
    ClaimKind("edge_effect", ("edge_stats",)),
    ClaimKind("head_stability", ("heads",)),
    ClaimKind("layer_stability", ("layers",)),
    ClaimKind("approximation", ("approximation_summary",)),
    # verified runs (spec key verify; docs/verified.md): the mean exact effect of an edge, and the missed-edges bound
    ClaimKind("verified_edge", ("verified",)),
    ClaimKind("missed_edges", ("missed_edges",)),
    # a published circuit audited on this run (spec key circuit; docs/mib.md)
    ClaimKind("published_circuit", ("published_circuit",)),
    # hypothesis tests of a circuit (spec key tests; docs/hypothesis-tests.md), one kind per test
    ClaimKind("circuit_equivalent", ("circuit_tests",)),
    ClaimKind("circuit_equivalent_tost", ("circuit_tests",)),
    ClaimKind("circuit_independent", ("circuit_tests",)),
    ClaimKind("circuit_minimal", ("circuit_tests", "circuit_minimality")),
    ClaimKind("circuit_sufficient", ("circuit_tests",)),
    ClaimKind("circuit_partially_necessary", ("circuit_tests",)),
    ClaimKind("sink", ("sink_heads",), "tokens"),
    ClaimKind("token_importance", ("token_importance_diffs",), "tokens"),
    ClaimKind("token_drop", ("token_importance",), "tokens"),
    # an item of sink_stability, or of sink_matching (sink heads matched across seeds): either table's columns
    ClaimKind("sink_stability", ("sink_stability", "sink_matching"), "tokens"),
    ClaimKind("token_stability", ("token_stability",), "tokens"),
)}
CLAIM_KINDS: tuple[str, ...] = tuple(KINDS)
#: kinds answered by a ``circuitstat tokens`` run, not by the audit
TOKEN_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.answered_by == "tokens")


#: circuit-test claim kind -> (the test's row in circuit_tests, whether the claim holds when the null is rejected)
CIRCUIT_TESTS: dict[str, tuple[str, bool]] = {
    "circuit_equivalent": ("equivalence", False), "circuit_equivalent_tost": ("equivalence_tost", True),
    "circuit_independent": ("independence", False),
    "circuit_minimal": ("minimality", False), "circuit_sufficient": ("sufficiency", True),
    "circuit_partially_necessary": ("partial_necessity", True)}


def statistics(kind: str) -> tuple[str, ...]:
    """Return the statistics a claim of ``kind`` may bound (the claimable columns of its tables)."""
    return KINDS[kind].statistics
