"""``python -m circuitstat.pipelines.cli``: the circuitstat command line."""

from circuitstat.pipelines.cli import main

main()
