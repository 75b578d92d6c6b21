"""The one list of the report's sections, in page order: anchor id, heading, parts, and when each is shown.

To add, remove or reorder a section, edit `REPORT_SECTIONS`; the page (reports.html.page), its
navigation and the public `SECTIONS` / `OPTIONAL_SECTIONS` follow from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reports.html.approximation import approximation_section
from reports.html.calibration import calibration_part
from reports.html.common import Tables, part
from reports.html.faithfulness import faithfulness_section
from reports.html.forest import forest_section
from reports.html.graph import graph_section
from reports.html.heads import heads_part, layers_part, residual_part
from reports.html.stability import stability_section
from reports.html.summary import summary_section
from reports.html.svg import esc
from reports.html.tokens import has_tokens, tokens_section
from reports.html.variance import variance_part, variance_summary_part

__all__ = ["Context", "Section", "REPORT_SECTIONS", "SECTIONS", "OPTIONAL_SECTIONS", "shown_sections"]


@dataclass(frozen=True)
class Context:
    """What the sections read: the run's tables, its methods (exact first) and the models of a cross-seed run."""

    T: Tables
    methods: list[str]
    sources: list[str]  # model-<i> of a cross-seed run is sources[i]


Part = Callable[[Context], str]


@dataclass(frozen=True)
class Section:
    """One section of the page: its parts each become a note when their tables are missing."""

    id: str
    heading: str
    parts: tuple[Part, ...]
    shown_when: Callable[[Tables], bool] | None = None  # None: on every report

    def html(self, ctx: Context) -> str:
        """Return the section element: its heading, then its parts in order."""
        body = "".join(part(lambda p=p: p(ctx)) for p in self.parts)
        return f'<section id="{self.id}"><h2>{esc(self.heading)}</h2>{body}</section>'


def _tables_only(fn: Callable[[Tables], str]) -> Part:
    """Return a part that reads the tables only."""
    return lambda ctx: fn(ctx.T)


def _with_methods(fn: Callable[[Tables, list[str]], str]) -> Part:
    """Return a part that reads the tables and the run's methods."""
    return lambda ctx: fn(ctx.T, ctx.methods)


REPORT_SECTIONS: tuple[Section, ...] = (
    Section("summary", "Summary", (_tables_only(summary_section),)),
    Section("graph", "Circuit graph", (_with_methods(graph_section),)),
    Section("stability", "Circuit stability: Jaccard vs k", (_with_methods(stability_section),)),
    Section("forest", "Edge effects: top edges with confidence intervals", (_with_methods(forest_section),)),
    Section("approximation", "Approximation error: exact vs approximate", (_with_methods(approximation_section),)),
    Section("faithfulness", "Faithfulness vs circuit size", (_with_methods(faithfulness_section),)),
    Section("heads", "Head and layer stability across seeds",
            (_tables_only(heads_part), _tables_only(layers_part), _tables_only(residual_part))),
    Section("variance", "Variance study: where the uncertainty comes from",
            (_tables_only(variance_part), _tables_only(variance_summary_part))),
    Section("calibration", "Calibration: interval coverage vs N", (_tables_only(calibration_part),)),
    # shown only when the run holds its tables (a `circuitstat tokens` run, at its top or per model)
    Section("tokens", "Token contributions and attention sinks", (lambda ctx: tokens_section(ctx.T, ctx.sources),),
            shown_when=has_tokens),
)

# (id, heading): the headings a reader (and the browser test) finds on every report, and those of optional sections.
SECTIONS = tuple((s.id, s.heading) for s in REPORT_SECTIONS if s.shown_when is None)
OPTIONAL_SECTIONS = tuple((s.id, s.heading) for s in REPORT_SECTIONS if s.shown_when is not None)


def shown_sections(T: Tables) -> list[Section]:
    """Return the sections this run's report shows, in page order."""
    return [s for s in REPORT_SECTIONS if s.shown_when is None or s.shown_when(T)]
