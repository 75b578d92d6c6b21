"""The `tokens` run kind: token contribution weights and attention sinks."""
