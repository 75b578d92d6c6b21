"""circuitstat circuits layer: models, the component graph, tasks, attribution, circuits.

Names load lazily (PEP 562) so that importing one module does not import torch. Errors live on the
ground floor (``reports.errors``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ComponentGraph": ".graph", "Intervention": ".interventions", "load_hf": ".loading",
    "load_model": ".loading", "CircuitModel": ".model", "ModelConfig": ".engine.config",
    "RunOutput": ".engine.run", "RunState": ".engine.run",
}

__all__ = [
    "CircuitModel", "ComponentGraph", "Intervention", "ModelConfig", "RunOutput", "RunState", "load_hf", "load_model",
]


def __getattr__(name: str) -> Any:
    """The lazily imported public name ``name`` (its module is imported on first use)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'circuits' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
