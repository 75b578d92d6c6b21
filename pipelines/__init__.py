"""circuitstat pipelines layer."""
