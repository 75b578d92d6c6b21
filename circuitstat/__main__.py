"""``python -m circuitstat``: the circuitstat command line."""

from circuitstat.pipelines.cli import main

main()
