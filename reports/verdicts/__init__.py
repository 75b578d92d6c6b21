"""The one-screen verdict of a run, built once from its tables and rendered twice (terminal and report).

``verdict(run_dir)`` returns a `Verdict` (circuitstat.reports.verdicts.build; its rules are in the module doc of
circuitstat.reports.verdicts.model and printed with it); ``verdict_text`` renders it for the terminal
(`circuitstat audit` and `circuitstat demo` end with it) and circuitstat.reports.html.verdict for the page it opens.
"""

from circuitstat.reports.verdicts.build import choose_k, circuit_edges, primary_method, verdict
from circuitstat.reports.verdicts.model import BAR, Line, Verdict, run_spec
from circuitstat.reports.verdicts.text import verdict_text

__all__ = ["BAR", "Line", "Verdict", "choose_k", "circuit_edges", "primary_method", "run_spec", "verdict",
           "verdict_text"]
