"""The `sample-size` run kind: its spec and run (run.py) and the simulation it runs (simulate.py)."""
