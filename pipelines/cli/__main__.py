"""``python -m pipelines.cli``: the circuitstat command line."""

from pipelines.cli import main

main()
