"""circuitstat circuits layer."""
