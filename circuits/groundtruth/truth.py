"""A model with a known circuit: the model, its true edge sets, and a task generator.

:class:`GroundTruthModel` is what the ground-truth study and its tests consume, whatever built the
model (a tracr fixture, circuitstat.circuits.groundtruth.compiled; a planted circuit, circuitstat.circuits.groundtruth.planted):

* ``truth``: the true circuit as a boolean edge mask in the model's graph (for compiled models the
  task circuit; for planted ones the planted edges), the set discovery is scored against;
* ``null_edges``: edges whose population mean effect is exactly zero (everything outside the truth on
  the models built here), the nulls of a per-edge test's false discovery proportion;
* ``per_example_nulls``: null edges whose per-example effect is not zero (a test that rejects them is
  fooled by noise, not by an exact zero);
* ``extra``: further labelled edge sets (a compiled model's ``structural`` circuit);
* ``task(n, seed)``: clean/corrupted prompt pairs of the model's task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from circuitstat.core.errors import InputError

__all__ = ["GroundTruthModel", "edge_mask"]


def edge_mask(graph, names) -> np.ndarray:
    """Boolean [E] mask of the edges called ``names`` (InputError naming the first unknown one)."""
    mask = np.zeros(graph.n_edges, dtype=bool)
    for name in names:
        try:
            mask[graph.edge_index(name)] = True
        except KeyError as e:
            raise InputError(f"ground truth names an edge the model does not have: {e}") from None
    return mask


@dataclass
class GroundTruthModel:
    """A model with its true circuit and task; see the module docstring."""

    name: str
    kind: str  # "compiled" or "planted"
    model: object
    truth: np.ndarray
    null_edges: np.ndarray
    make_task: Callable[[int, int], object]
    describe: str = ""
    per_example_nulls: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        E = self.model.graph.n_edges
        for label, m in (("truth", self.truth), ("null_edges", self.null_edges)):
            if m.shape != (E,) or m.dtype != bool:
                raise ValueError(f"{self.name}: {label} must be a boolean mask over the {E} edges")
        if (self.truth & self.null_edges).any():
            raise ValueError(f"{self.name}: an edge cannot be both true and null")

    def task(self, n: int, seed: int):
        """The model's task with ``n`` prompt pairs drawn from ``seed``."""
        return self.make_task(int(n), int(seed))

    def truth_names(self) -> list[str]:
        """Names of the true edges."""
        names = self.model.graph.edge_names
        return [names[i] for i in np.flatnonzero(self.truth)]

    def identity(self) -> dict:
        """Provenance: the model's identity plus the truth's size and kind."""
        return {**self.model.identity(), "groundtruth": self.name, "kind": self.kind,
                "n_true": int(self.truth.sum()), "n_null": int(self.null_edges.sum())}
