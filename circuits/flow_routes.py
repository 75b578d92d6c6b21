"""Information flow routes (Ferrando & Voita 2024, "Information Flow Routes: Automatically Interpreting Language
Models at Scale", arXiv:2403.00824), as the EAP-IG library defines it for edges (hannamw/EAP-IG, eap/attribute.py,
``get_scores_information_flow_routes``).

Per example, receiver v and real position p, with x_v(p) the receiver's input (the residual stream it reads, before
its norm) and z_u(p) the output of an upstream sender u:

    proximity_u(p) = max(0, ||x_v(p)||_1 − ||x_v(p) − z_u(p)||_1)
    importance_u(p) = proximity_u(p) / Σ_{u' upstream of v} proximity_u'(p)
    score(u → v) = mean over the example's real positions of importance_u(p)

One clean forward, no metric, no gradient and no counterfactual: an edge's score is how much of its receiver's input
its sender makes up, not the effect of patching it (the ScoreMatrix's ablation reads "none"). Scores lie in [0, 1]
and a receiver's in-edges sum to 1 at every position where some sender is proximate. Where none is (Σ proximity =
0, which the library divides as 0/0 = NaN) the position adds 0 to every in-edge of that receiver. Heads' q, k and v
receivers read the same residual, so they score alike, as in the library. Defined where every sender's write is
added to the residual stream (not on post-norm models; its record says so: circuitstat.circuits.methods).
"""

from __future__ import annotations

import torch


def route_importance(x: torch.Tensor, z: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """[B, U] mean over real positions of each sender's share of the proximity to receiver input ``x`` [B, P, D]
    (``z`` [B, U, P, D] the upstream senders' outputs, ``real`` [B, P] bool the real positions)."""
    norm = x.abs().sum(-1)  # [B, P]
    proximity = (norm[:, None] - (x[:, None] - z).abs().sum(-1)).clamp(min=0)  # [B, U, P]
    total = proximity.sum(1, keepdim=True)
    share = torch.where(total > 0, proximity / total.clamp(min=torch.finfo(total.dtype).tiny), 0.0)
    share = share * real[:, None]
    return share.sum(-1) / real.sum(-1, keepdim=True).clamp(min=1)


@torch.no_grad()
def score_flow_routes(model, data, batch, cf, job) -> torch.Tensor:
    """[B, E] information-flow-route scores of one batch (``cf`` unused: the method reads no counterfactual)."""
    g, cfg = model.graph, model.cfg
    out = model.run(batch.clean, batch.mask, keep_senders=True, keep_resid=True, compute_logits=False)
    z = out.senders.float()
    real = batch.mask.bool()
    scores = torch.zeros(z.shape[0], g.n_edges, device=z.device)
    reads = []  # (receiver input [B, P, D], the receivers that read it)
    for layer in range(cfg.n_layers):
        heads = [g.attention_receiver(layer, kind, h) for kind in "qkv" for h in range(cfg.n_heads)]
        reads.append((out.resid_pre[layer], heads))
        if cfg.has_mlp:  # a parallel block's MLP reads the layer's input, as its heads do
            reads.append((out.resid_pre[layer] if cfg.parallel else out.resid_mid[layer], [g.mlp_receiver(layer)]))
    reads.append((out.final_resid, [g.logits_receiver]))
    for x, receivers in reads:
        U = int(g.n_upstream[receivers[0]])
        share = route_importance(x.float(), z[:, :U], real)
        for r in receivers:
            start = int(g.edge_offset[r])
            scores[:, start : start + U] = share
    return scores
