"""The option vocabularies shared by specs (circuitstat.pipelines.spec) and the command line (circuitstat.pipelines.cli).

Kept apart from circuitstat.pipelines.spec so that the command line builds its choices without importing
pydantic (about 0.3 s of every command's start-up).
"""

from __future__ import annotations

from typing import Literal

from circuitstat.circuits.methods import ABLATIONS, LEVELS, MASK_METHODS, METHODS

__all__ = ["METHOD", "SCORE_METHOD", "MASK_METHOD", "MASK_METHODS", "OBJECTIVE", "ABLATION", "LEVEL", "METRIC", "VERIFY_DESIGN",
           "INPUT_NODE", "MOE_NODES", "DTYPES", "SAMPLE_SIZE_MEANS", "SAMPLE_SIZE_NS", "SAMPLE_SIZE_N_RANGE",
           "SAMPLE_SIZE_KS", "SAMPLE_SIZE_TARGET", "SAMPLE_SIZE_DATASETS", "SAMPLE_SIZE_DATASETS_RANGE",
           "SAMPLE_SIZE_LEVEL", "SAMPLE_SIZE_LEVEL_RANGE"]

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
VERIFY_DESIGN = Literal["uniform", "active"]  # a verified run's phase 2 (docs/verified.md; pipelines.verify)
METRIC = Literal["logit_diff", "prob_diff", "kl", "kl_mean", "cross_entropy"]
# --dtype names and the torch dtype each means (the short names are aliases)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}

# sample-size (circuitstat.pipelines.runs.sample_size.run): the defaults and bounds its spec and its command's options share
SAMPLE_SIZE_MEANS = ("tested", "deconvolved", "pilot", "posterior")  # the simulated population's means (docs/sample-size.md)
SAMPLE_SIZE_NS = (64, 128, 256, 512)  # prompts N predicted at
SAMPLE_SIZE_N_RANGE = (2, 10_000_000)
SAMPLE_SIZE_KS = (5, 10, 20)  # circuit sizes
SAMPLE_SIZE_TARGET = 0.5  # the Jaccard a data-level interval's lower end should clear
SAMPLE_SIZE_DATASETS, SAMPLE_SIZE_DATASETS_RANGE = 20, (2, 10_000)  # simulated datasets per N
SAMPLE_SIZE_LEVEL, SAMPLE_SIZE_LEVEL_RANGE = 0.9, (0.5, 0.999)  # the prediction intervals' level
