"""The self-contained HTML report of a run directory: ``render_report(run_dir) -> report.html``.

One module per analysis (graph, stability, forest, approximation, faithfulness, heads, variance,
calibration, tokens, summary), what they share (common: table access, HTML tables, figures), the
inline SVG plots (svg), the page's stylesheet and script (assets), the one list of sections in
page order (sections) and the page assembly (page).
"""

from reports.html.page import OPTIONAL_SECTIONS, REPORT_NAME, SECTIONS, TABLES, render_report, report_path

__all__ = ["REPORT_NAME", "SECTIONS", "OPTIONAL_SECTIONS", "TABLES", "render_report", "report_path"]
