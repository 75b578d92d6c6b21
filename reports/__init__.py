"""circuitstat reports layer."""
