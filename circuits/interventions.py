"""What to change in a forward pass: edges, senders or one receiver's input.

All three kinds are batched: every tensor has a leading example/row dimension (or broadcasts
over it), so many different interventions run in one forward.

* ``edge_mask`` [B, E] (or [E]): for each edge u -> v with mask m, receiver v reads
  ``z_u(current) + m * (z_u(counterfactual) - z_u(current))`` instead of ``z_u(current)``.
  "Current" is the sender's output in this (possibly already patched) run, the semantics of
  ACDC and of the EAP-IG library's ``evaluate_graph``: edges outside a circuit carry the
  counterfactual, edges inside carry whatever flows through the circuit.  Fractional masks
  interpolate.
* ``sender_mask`` [B, U] (or [U]): the sender's output is replaced by its counterfactual value
  everywhere downstream (node patching).
* ``sender_value`` (u, value [B, P, D]): sender u's output is replaced by ``value`` (one
  sender for all rows; exact node effects batch examples this way).
* ``receiver_delta`` (r, delta [B, P, D]): ``delta`` is added to receiver r's input.  Exact
  per-edge effects use it: patching edge u -> v is adding ``z_u(cf) - z_u(clean)`` to v's input
  (on post-norm models, Gemma 2/3 and OLMo 2, a head's N(S + Δz_u) - N(S):
  ``CircuitModel.sender_write_deltas``; see circuitstat.circuits.engine.run).

``counterfactual`` holds the senders' counterfactual outputs ``[B | 1, U, P | 1, D]``: the
corrupted run's outputs, a mean over a reference dataset (per position or not), zeros, or
another example's outputs (resample ablation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from circuitstat.core.errors import InputError


@dataclass
class Intervention:
    """A batched intervention; see the module docstring for the semantics of each field."""

    counterfactual: torch.Tensor | None = None
    edge_mask: torch.Tensor | None = None
    sender_mask: torch.Tensor | None = None
    receiver: int | None = None
    receiver_delta: torch.Tensor | None = None
    sender: int | None = None
    sender_value: torch.Tensor | None = None

    @classmethod
    def edges(cls, mask: torch.Tensor, counterfactual: torch.Tensor) -> "Intervention":
        """Patch the edges where ``mask`` is 1 (per example if 2-D) with ``counterfactual``."""
        return cls(counterfactual=counterfactual, edge_mask=mask)

    @classmethod
    def nodes(cls, mask: torch.Tensor, counterfactual: torch.Tensor) -> "Intervention":
        """Replace the outputs of the senders where ``mask`` is 1 by ``counterfactual``."""
        return cls(counterfactual=counterfactual, sender_mask=mask)

    @classmethod
    def at_receiver(cls, receiver: int, delta: torch.Tensor) -> "Intervention":
        """Add ``delta`` [B, P, D] to receiver ``receiver``'s input."""
        return cls(receiver=receiver, receiver_delta=delta)

    @classmethod
    def at_sender(cls, sender: int, value: torch.Tensor) -> "Intervention":
        """Replace sender ``sender``'s output by ``value`` [B, P, D] everywhere downstream."""
        return cls(sender=sender, sender_value=value)

    def validate(self, n_edges: int, n_senders: int) -> None:
        """Raise InputError when shapes do not fit a graph with these sizes."""
        if (self.edge_mask is not None or self.sender_mask is not None) and self.counterfactual is None:
            raise InputError("an edge or sender mask needs counterfactual sender outputs [B, U, P, D]")
        if self.edge_mask is not None and self.edge_mask.shape[-1] != n_edges:
            raise InputError(f"edge mask has {self.edge_mask.shape[-1]} entries, the graph has {n_edges} edges")
        if self.sender_mask is not None and self.sender_mask.shape[-1] != n_senders:
            raise InputError(f"sender mask has {self.sender_mask.shape[-1]} entries, the graph has {n_senders} senders")
        if self.counterfactual is not None and self.counterfactual.shape[1] != n_senders:
            raise InputError(
                f"counterfactual has {self.counterfactual.shape[1]} senders, the graph has {n_senders}"
            )
        if (self.receiver is None) != (self.receiver_delta is None):
            raise InputError("a receiver intervention needs both the receiver index and the delta")
        if (self.sender is None) != (self.sender_value is None):
            raise InputError("a sender intervention needs both the sender index and the value")
