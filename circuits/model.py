"""CircuitModel: one functional transformer forward pass that exposes every sender and receiver.

Weights of every supported family are held in one uniform per-layer form, so attribution code
is written once; the forward pass keeps the residual stream equal to the sum of all sender
outputs plus constant biases, which makes edge interventions exact.  The class is assembled here
from the parts in :mod:`circuitstat.circuits.engine` (one module per idea: config, weights, norms, rotary,
masks, attention, MLP, the run, the fused training forward, patching, gradients).
"""

from __future__ import annotations

from .engine.config import ModelConfig
from .engine.fused import FusedForward
from .engine.gradients import ReceiverGradients
from .engine.patching import Patching
from .engine.run import Forward, RunOutput, RunState
from .engine.weights import ModelWeights

__all__ = ["CircuitModel", "ModelConfig", "RunOutput", "RunState"]


class CircuitModel(Forward, FusedForward, Patching, ReceiverGradients, ModelWeights):
    """A transformer in the uniform form, with interventions, suffix runs and receiver gradients.

    ``CircuitModel(cfg)`` holds zero weights (``init_weights``, ``from_state_dict`` or the
    converters in :mod:`circuitstat.circuits.convert` fill them); ``run`` is the forward pass with
    interventions (:mod:`circuitstat.circuits.engine.run`), ``patched_layer_logits`` the patched suffixes
    (:mod:`circuitstat.circuits.engine.patching`), ``receiver_input_grads`` the per-head receiver gradients
    (:mod:`circuitstat.circuits.engine.gradients`), ``weight_hash``/``identity``/``save`` its identity
    (:mod:`circuitstat.circuits.engine.weights`).
    """
