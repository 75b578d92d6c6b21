"""circuitstat circuits layer: models, the component graph, tasks, attribution, circuits."""

from .errors import InputError, UnsupportedArchitectureError
from .graph import ComponentGraph
from .interventions import Intervention
from .loading import load_hf, load_model
from .model import CircuitModel, ModelConfig, RunOutput, RunState

__all__ = [
    "CircuitModel", "ComponentGraph", "InputError", "Intervention", "ModelConfig", "RunOutput", "RunState",
    "UnsupportedArchitectureError", "load_hf", "load_model",
]
