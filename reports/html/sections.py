"""The one list of the report's sections, in page order: anchor id, heading, analysis, parts.

A section is shown only when the run holds its analysis (circuitstat.reports.analyses.present); the verdict
says in one line which analyses were not run and how to run them. A part is drawn when one of its
tables is in the run (a part of a shown section whose table is absent is left out; one whose table
lacks a column is a note). To add, remove or reorder a section, edit `REPORT_SECTIONS`; the page
(circuitstat.reports.html.page), its navigation and the public `SECTIONS` follow from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from circuitstat.reports.analyses import present
from circuitstat.reports.html.approximation import approximation_section
from circuitstat.reports.html.calibration import calibration_part
from circuitstat.reports.html.circuit_tests import circuit_tests_section
from circuitstat.reports.html.common import Tables, part
from circuitstat.reports.html.faithfulness import faithfulness_section
from circuitstat.reports.html.forest import forest_section
from circuitstat.reports.html.graph import graph_section
from circuitstat.reports.html.groundtruth import groundtruth_part
from circuitstat.reports.html.masks import masks_part
from circuitstat.reports.html.heads import head_summary_part, heads_part, layers_part, residual_part
from circuitstat.reports.html.stability import stability_section
from circuitstat.reports.html.svg import esc
from circuitstat.reports.html.tokens import tokens_section
from circuitstat.reports.html.variance import variance_part, variance_summary_part
from circuitstat.reports.html.verdict import verdict_section
from circuitstat.reports.html.published import published_section
from circuitstat.reports.html.verified import verified_section
from circuitstat.reports.verdicts import Verdict

__all__ = ["Context", "Section", "REPORT_SECTIONS", "SECTIONS", "shown_sections"]


@dataclass(frozen=True)
class Context:
    """What the sections read: the tables, the methods (exact first), a cross-seed run's models, the verdict."""

    T: Tables
    methods: list[str]
    sources: list[str]  # model-<i> of a cross-seed run is sources[i]
    verdict: Verdict
    shown: frozenset[str]  # ids of the sections the page shows


Part = Callable[[Context], str]


@dataclass(frozen=True)
class Section:
    """One section of the page: shown when the run holds `analysis`; each part drawn when one of its tables is there."""

    id: str
    heading: str
    analysis: str | None  # an id of circuitstat.reports.analyses.ANALYSES; None: on every report
    parts: tuple[tuple[Part, tuple[str, ...]], ...]  # (part, tables any of which it draws; () = always)

    def html(self, ctx: Context) -> str:
        """Return the section element: its heading, then the parts whose tables the run has."""
        body = "".join(part(lambda p=p: p(ctx)) for p, tables in self.parts
                       if not tables or any(ctx.T.path(t).exists() for t in tables))
        return f'<section id="{self.id}"><h2>{esc(self.heading)}</h2>{body}</section>'

    def shown_for(self, T: Tables) -> bool:
        """Return whether the run's report shows this section."""
        return self.analysis is None or present(T, self.analysis)


def _t(fn: Callable[[Tables], str]) -> Part:
    """Return a part that reads the tables only."""
    return lambda ctx: fn(ctx.T)


def _m(fn: Callable[[Tables, list[str]], str]) -> Part:
    """Return a part that reads the tables and the run's methods."""
    return lambda ctx: fn(ctx.T, ctx.methods)


REPORT_SECTIONS: tuple[Section, ...] = (
    Section("verdict", "Verdict", None, ((lambda ctx: verdict_section(ctx.T, ctx.verdict, ctx.shown), ()),)),
    Section("graph", "Circuit graph", "audit", ((_m(graph_section), ()),)),
    Section("forest", "Edge effects: top edges with confidence intervals", "audit",
            ((_m(forest_section), ("edge_stats",)), (_m(masks_part), ("edge_masks",)))),
    Section("stability", "Circuit stability: data-level Jaccard vs k", "audit", ((_m(stability_section), ("stability_vs_k",)),)),
    Section("faithfulness", "Faithfulness vs circuit size", "faithfulness", ((_m(faithfulness_section), ()),)),
    Section("approximation", "Approximation error: exact vs approximate", "approximation",
            ((_m(approximation_section), ()),)),
    Section("verified", "Verified: the mean exact effect from exact patching on a random subset", "verified",
            ((_t(verified_section), ("verified",)),)),
    Section("published", "Published circuit: checked on this model and these prompts", "published",
            ((_t(published_section), ("published_circuit",)),)),
    Section("circuit_tests", "Hypothesis tests of the circuit: equivalence, independence, minimality, sufficiency",
            "circuit_tests", ((_t(circuit_tests_section), ("circuit_tests",)),)),
    Section("heads", "Head and layer stability across seeds", "heads",
            ((_t(heads_part), ("heads",)), (_t(layers_part), ("layers",)), (_t(residual_part), ("residual",)),
             (_t(head_summary_part), ("summary",)))),
    Section("variance", "Variance study: where the uncertainty comes from", "variance",
            ((_t(variance_part), ("variance_components",)), (_t(variance_summary_part), ("variance_summary",)))),
    Section("calibration", "Calibration: interval coverage vs N", "calibration", ((_t(calibration_part), ()),)),
    Section("groundtruth", "Ground truth: discovery against known circuits", "groundtruth",
            ((_t(groundtruth_part), ()),)),
    Section("tokens", "Token contributions and attention sinks", "tokens",
            ((lambda ctx: tokens_section(ctx.T, ctx.sources), ()),)),
)

#: (id, heading) of every section, in page order (a report shows those whose analysis its run holds)
SECTIONS = tuple((s.id, s.heading) for s in REPORT_SECTIONS)


def shown_sections(T: Tables) -> list[Section]:
    """Return the sections this run's report shows, in page order."""
    return [s for s in REPORT_SECTIONS if s.shown_for(T)]
