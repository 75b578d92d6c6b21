"""The self-contained HTML report of a run directory: ``render_report(run_dir) -> report.html``.

One module per analysis (graph and graph_draw, forest, stability, faithfulness, approximation,
heads, variance, calibration, tokens and tokens_seeds, summary), the first screen (verdict: the run's
verdict from circuitstat.reports.verdicts beside its circuit), what they share (common: tables, intervals, HTML
tables and figures), the inline SVG plots (svg), the page's stylesheet and script (assets), the one
list of sections in page order (sections) and the page assembly (page).
"""

from circuitstat.reports.html.page import REPORT_NAME, SECTIONS, TABLES, render_report, report_path

__all__ = ["REPORT_NAME", "SECTIONS", "TABLES", "render_report", "report_path"]
