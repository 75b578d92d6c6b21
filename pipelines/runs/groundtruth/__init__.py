"""The `study groundtruth` run kind: discovery methods against known circuits (study.py) and its mask methods (masks.py)."""
