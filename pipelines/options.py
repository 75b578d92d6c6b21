"""The option vocabularies shared by specs (circuitstat.pipelines.spec) and the command line (circuitstat.pipelines.cli).

Kept apart from circuitstat.pipelines.spec so that the command line builds its choices without importing
pydantic (about 0.3 s of every command's start-up).
"""

from __future__ import annotations

from typing import Literal

from circuitstat.circuits.methods import ABLATIONS, LEVELS, MASK_METHODS, METHODS

__all__ = ["METHOD", "SCORE_METHOD", "MASK_METHOD", "MASK_METHODS", "OBJECTIVE", "ABLATION", "LEVEL", "METRIC",
           "INPUT_NODE", "MOE_NODES", "DTYPES"]

# the methods' names come from their records (circuitstat.circuits.methods: torch- and pydantic-free)
# methods with per-example scores [N, E] (attribution); atp-*: AtP* (circuitstat.circuits.atpstar); ensemble: the
# mean of eap, eap-ig-inputs and eap-ig-activations
SCORE_METHOD = Literal[METHODS]
# mask-learned methods: one learned mask logit per edge per fit, no per-example scores (docs/edge-pruning.md)
MASK_METHOD = Literal[MASK_METHODS]  # ugs: uniform gradient sampling (circuitstat.circuits.ugs)
METHOD = Literal[SCORE_METHOD, MASK_METHOD]  # what attribute and audit accept
OBJECTIVE = Literal["mean_metric", "metric", "kl"]  # the mask methods' faithfulness term (circuitstat.circuits.edge_pruning)
ABLATION = Literal[ABLATIONS]
LEVEL = Literal[LEVELS]
INPUT_NODE = Literal["embeddings", "tokens"]  # circuitstat.circuits.ablation: what a zero/mean-ablated input sender is
# circuitstat.circuits.moe_nodes: a mixture-of-experts layer's MLP as one sender (block) or one per expert (experts)
MOE_NODES = Literal["block", "experts"]
METRIC = Literal["logit_diff", "prob_diff", "kl", "kl_mean", "cross_entropy"]
# --dtype names and the torch dtype each means (the short names are aliases)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
