"""circuitstat circuits layer: models, the component graph, tasks, attribution, circuits.

Names load lazily (PEP 562) so that importing one module does not import torch. Errors live on the
ground floor (``circuitstat.core.errors``).
"""

from __future__ import annotations

from circuitstat.core.lazy import lazy_names

_MODULES = {
    ".graph": ["ComponentGraph"], ".interventions": ["Intervention"], ".loading": ["load_hf", "load_model"],
    ".model": ["CircuitModel"], ".engine.config": ["ModelConfig"], ".engine.run": ["RunOutput", "RunState"],
}
__all__, __getattr__ = lazy_names(__name__, _MODULES)
