"""Convenience: ``python -m circuitstat.reports.html RUN_DIR [OUT]`` writes the report and prints its path."""

import sys

from circuitstat.reports.html.page import render_report

if __name__ == "__main__":  # pragma: no cover
    print(render_report(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
