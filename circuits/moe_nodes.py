"""The ``moe_nodes`` option: a mixture-of-experts layer's MLP as one sender (``block``) or one sender per expert.

``block`` (the default): the router and all experts are one MLP node ``m{L}``, the graph of a dense model.
``experts``: each sparse layer's MLP *sender* is split into ``m{L}.e0 .. m{L}.e{X-1}`` (sender J writes
w_J(x) expert_J(x) at the tokens whose router selected J, else 0) and ``m{L}.shared`` where the family has a
shared expert (sigmoid(x w_s) shared(x)); they sum to the block's output, so edges stay additive and exact
patching exact.  The *receiver* stays the block's input ``m{L}``: the router and every expert read the same
normed residual, and per-expert receivers would need a per-expert copy of the router's input, which is not
the model's computation.  Dense layers (Qwen2/3-MoE's ``mlp_only_layers``) keep their one sender ``m{L}``.
See docs/families.md, "Experts as nodes".
"""

from __future__ import annotations

from circuitstat.core.errors import InputError
from .graph import ComponentGraph

MOE_NODES = ("block", "experts")


def check_moe_nodes(cfg, moe_nodes: str) -> None:
    """None; InputError when ``moe_nodes`` is unknown, or ``experts`` on a model without an MoE layer or
    whose expert writes would not add up (a norm after the MLP)."""
    if moe_nodes not in MOE_NODES:
        raise InputError(f"unknown moe_nodes {moe_nodes!r}; use one of {', '.join(MOE_NODES)}")
    if moe_nodes == "block":
        return
    if cfg.moe is None or not cfg.moe["sparse_layers"]:
        raise InputError(f"moe_nodes 'experts' splits mixture-of-experts layers into one node per expert, but this "
                         f"{cfg.arch!r} model has no mixture-of-experts layer; use moe_nodes 'block' (the default) "
                         "or a mixture-of-experts model (mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss)")
    if cfg.post_norm:  # the norm on the MLP output would make the experts' writes non-additive
        raise InputError("moe_nodes 'experts' needs additive expert writes, but this model normalises the MLP output "
                         "(a post-norm); use moe_nodes 'block'")


def graph_of(cfg, moe_nodes: str | None = None) -> ComponentGraph:
    """The component graph of a model with config ``cfg`` (``moe_nodes``: default the config's, else 'block')."""
    if moe_nodes is None:
        moe_nodes = getattr(cfg, "moe_nodes", "block")
    if moe_nodes == "block":
        return ComponentGraph(cfg.n_layers, cfg.n_heads, has_mlp=cfg.has_mlp, parallel=cfg.parallel)
    check_moe_nodes(cfg, moe_nodes)
    sparse = set(cfg.moe["sparse_layers"])
    experts = tuple(cfg.moe["experts"] if layer in sparse else 0 for layer in range(cfg.n_layers))
    return ComponentGraph(cfg.n_layers, cfg.n_heads, has_mlp=cfg.has_mlp, parallel=cfg.parallel, experts=experts,
                          shared_expert=bool(cfg.moe["d_shared"]))


def set_moe_nodes(model, moe_nodes: str):
    """``model`` (a CircuitModel or its config-only skeleton) with its graph built for ``moe_nodes``; InputError
    first when it cannot be.  The choice is kept on ``model.cfg`` (not a config field: never saved, never part
    of the weights' identity), so cost plans built from the config count the same graph."""
    check_moe_nodes(model.cfg, moe_nodes)
    model.cfg.moe_nodes = moe_nodes
    model.graph = graph_of(model.cfg, moe_nodes)
    return model
