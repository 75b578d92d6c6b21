"""A model's skeleton: its CircuitModel on the meta device, built from the config alone (no weight read
or allocated), with its tokenizer. What ``attribute --plan`` prices a run on: shapes, the component
graph and the task need no weights, so a config of any size can be planned (circuitstat.circuits.plan)."""

from __future__ import annotations

from pathlib import Path

from .checkpoint_count import checkpoint_parameters
from .model import CircuitModel

__all__ = ["checkpoint_parameters", "load_skeleton"]


def load_skeleton(source: str | Path, *, allow_pickle: bool = False, allow_large: bool = False,
                  name: str | None = None, weights: bool = True) -> CircuitModel:
    """The CircuitModel of ``source`` (as :func:`circuitstat.circuits.loading.load_model` accepts) on the meta device,
    after every check loading would make that needs no weights; its tokenizer attached. ``name``: the source as
    the user named it, recorded as the model's source (circuitstat.pipelines.sources). ``weights=False``: a HF
    directory with only config.json (and a tokenizer) is accepted, as ``attribute --plan`` needs no weights; by
    default a directory without weights is refused here, as loading it would be. ``checkpoint_parameters`` is set:
    the checkpoint's parameter count (:func:`checkpoint_parameters`)."""
    from .loading import materialise
    from .model_source import parse_source

    return materialise(parse_source(str(source), base="."), "meta", allow_pickle=allow_pickle,
                       allow_large=allow_large, name=name, weights=weights)
