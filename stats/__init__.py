"""circuitstat stats layer."""
