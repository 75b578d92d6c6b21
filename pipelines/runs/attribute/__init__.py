"""The `attribute` run kind: per-example scores (or a learned mask) of one method, its spec and its run."""
