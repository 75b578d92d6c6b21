"""Each numeric parameter's bounds and defaults, declared once for every entry point.

The command line (typer's ``min``/``max``), the YAML specs (pydantic's ``ge``/``le``), the Python
estimators, the mask fits of circuitstat.circuits and the service (which runs specs) read the same
:class:`Param`, so a value one entry point refuses is refused by all of them, with the same range in the
message, and a default is typed once.  Where a kind of run has its own default (the audit resamples 1000
times, ``heads`` 200) or its own minimum (the variance study's 100), it is named here by kind (the run
kind's or the command's name, ``study variance``), with the bounds beside it; the minimum is what the
computation needs, the maximum a work limit.  tests/pipelines/test_param_defaults.py checks that every
estimator's, command's and library function's default and bounds are these.

In core (the ground floor) so that circuits/ and stats/ read the same declarations as pipelines/; kept free
of pydantic and typer (as circuitstat.pipelines.options) so that the command line starts fast.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping

from circuitstat.core.errors import InputError

__all__ = ["Param", "N_RESAMPLES", "SEED", "N_JOBS", "BATCH_SIZE", "IG_STEPS", "PRUNING_STEPS", "PRUNING_LR",
           "PRUNING_SPARSITY", "PRUNING_INIT", "N_REFITS", "PRUNING_PARAMS", "PRUNING_TARGET", "PRUNING_WARMUP",
           "NODE_TARGET", "PRUNING_LR_LAMBDA", "LR_CONSTANTS", "UGS_SAMPLES", "INIT_STD", "REPEAT_FRACTION",
           "WARMUP_STEPS", "D_MLP", "MIN_LR_RATIO", "VERIFY_BUDGET", "PARAMS", "tail_resamples", "resamples_for_level"]


@dataclass(frozen=True)
class Param:
    """One numeric parameter: its name, inclusive bounds, default, and per-kind defaults and minimums."""

    name: str
    minimum: int | float
    maximum: int | float
    default: Any
    why: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    minimums: Mapping[str, int | float] = field(default_factory=dict)

    def default_for(self, kind: str | None = None) -> Any:
        """The default of this parameter for a kind of run (its own, else the common default)."""
        return self.defaults.get(kind, self.default) if kind else self.default

    def minimum_for(self, kind: str | None = None) -> int | float:
        """The smallest value a kind of run takes (its own minimum, else the common one)."""
        return self.minimums.get(kind, self.minimum) if kind else self.minimum

    def pydantic(self, kind: str | None = None, *, default: Any = ...) -> Any:
        """A pydantic ``Field`` with the kind's bounds and default (``default`` overrides)."""
        from pydantic import Field

        return Field(self.default_for(kind) if default is ... else default, ge=self.minimum_for(kind), le=self.maximum)

    @property
    def option(self) -> dict:
        """typer.Option keyword arguments carrying the bounds (``min``, ``max``)."""
        return {"min": self.minimum, "max": self.maximum}

    def check(self, value: Any, what: str | None = None) -> Any:
        """``value`` when it is a number within the bounds; InputError naming the range otherwise."""
        name = what or self.name
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = int(value)  # numpy integers too
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(self.minimum, int) and not isinstance(value, int)):
            raise InputError(f"{name} must be {'an integer' if isinstance(self.minimum, int) else 'a number'}, "
                             f"got {value!r}; use {self.minimum:,} to {self.maximum:,}")
        if not math.isfinite(value) or not self.minimum <= value <= self.maximum:
            raise InputError(f"{name} is {value!r}; use {self.minimum:,} to {self.maximum:,} ({self.why})")
        return value


N_RESAMPLES = Param(
    "n_resamples", 10, 100_000, 1000,
    "fewer than 10 resamples estimate no spread; more than 100,000 add nothing but time",
    defaults={"audit": 1000, "groundtruth": 1000, "heads": 200, "calibration": 500, "tokens": 2000,
              "study variance": 200},
    minimums={"study variance": 100})
"""Bootstrap (or subsampling) resamples. An interval at confidence level c needs more
(:func:`resamples_for_level`): one resample beyond each quantile. The variance study's dataset-sampling source is
a variance over its B bootstrap datasets, so it takes at least 100 (circuitstat.pipelines.runs.variance)."""

SEED = Param("seed", 0, 2**63 - 1, 0, "numpy's SeedSequence and torch take non-negative 63-bit seeds")
N_JOBS = Param("n_jobs", 1, 256, 1, "parallel workers", defaults={"study heads": 2})
BATCH_SIZE = Param("batch_size", 1, 4096, 16, "examples per forward; does not change the scores",
                   defaults={"groundtruth": 64, "tokens": 32, "heads": 50})
IG_STEPS = Param("ig_steps", 1, 1000, 5, "EAP-IG's integration steps")

# the mask-learned methods, edge pruning (circuitstat.circuits.edge_pruning) and UGS (circuitstat.circuits.ugs): each
# fit's options (one bound for both; a default by kind where UGS's differs), and the refits the audit's stability runs
PRUNING_STEPS = Param("steps", 1, 100_000, 50, "Adam steps of each mask fit (each about 3 forwards per prompt, "
                      "n_samples masked ones for UGS)")
PRUNING_LR = Param("lr", 1e-6, 100.0, 0.2, "Adam's learning rate on the mask logits (0 would learn nothing)",
                   defaults={"ugs": 0.1})
PRUNING_SPARSITY = Param("sparsity", 0.0, 10_000.0, 1.0, "weight of the expected share of open gates in the loss")
PRUNING_INIT = Param("init", -20.0, 20.0, 1.0, "every mask logit's starting value (gates start open above -1.4)")
N_REFITS = Param("n_refits", 2, 1000, 10, "mask-learned refits on bootstrap resamples of the prompts (stability needs "
                 "2 circuits to compare; each refit costs a whole fit)")
"""Refits of a mask-learned method in an audit's stability stage (``attribute`` writes one fit, no refits)."""
PRUNING_PARAMS = {p.name: p for p in (PRUNING_STEPS, PRUNING_LR, PRUNING_SPARSITY, PRUNING_INIT)}
PRUNING_TARGET = Param("target", 0.0, 0.999, None, "edge pruning's target share of edges removed (Bhaskar et al.'s "
                       "Lagrangian; unset: a fixed sparsity penalty)")
NODE_TARGET = Param("node_target", 0.0, 0.999, None, "edge pruning's target share of node (sender) gates closed, "
                    "with node masks (Bhaskar et al.'s second Lagrangian; unset: the fixed node_sparsity penalty)")
PRUNING_WARMUP = Param("warmup", 0, 100_000, None, "steps over which the target sparsity rises linearly from 0 "
                       "(default: half the steps)")
PRUNING_LR_LAMBDA = Param("lr_lambda", 1e-6, 100.0, None, "learning rate of the Lagrange multipliers' gradient "
                          "ascent (default: lr)")
LR_CONSTANTS = Param("lr_constants", 0.0, 100.0, 1e-3, "Adam's learning rate on the optimal-ablation constants "
                     "(Li & Janson's lr_modes in utils/MaskConfig.py: 1e-3 before commit ac02e85, 2e-3 after)")
UGS_SAMPLES = Param("n_samples", 1, 1000, 4, "UGS's mask draws per prompt and step (Li & Janson use 12; each is a "
                    "masked forward and backward)")


# Training recipe parameters (circuitstat train, TrainRecipe, the zoo's recipes)
INIT_STD = Param("init_std", 1e-6, 10.0, None,
                 "std of the weight matrices at step 0 (default: GPT-2's 0.02); the zoo uses 1/sqrt(d_model)")
REPEAT_FRACTION = Param("repeat_fraction", 0.0, 1.0, 0.0,
                        "share of training sequences in which a span is copied later (a share: 0 to 1)")
WARMUP_STEPS = Param("warmup_steps", 0, 10_000_000, 50, "steps of linear learning-rate warmup")
D_MLP = Param("d_mlp", 1, 1_048_576, None, "MLP hidden width (default 4 d_model)")
MIN_LR_RATIO = Param("min_lr_ratio", 0.0, 1.0, 0.1,
                     "final learning rate of the cosine schedule as a share of the peak (1: constant after warmup)")

VERIFY_BUDGET = Param("verify_budget", 4.0, 100_000.0, None,
                      "the active design's expected exact cells per edge (its t interval has cells - 2 degrees of "
                      "freedom); at most the task's prompts")
"""A verified run's active design (circuitstat.stats.verified.active): the expected exact (prompt, edge) cells per
edge; the same bounds as the uniform design's n prompts."""


PARAMS = {p.name: p for p in (N_RESAMPLES, SEED, N_JOBS, BATCH_SIZE, IG_STEPS, N_REFITS, *PRUNING_PARAMS.values(),
                              PRUNING_TARGET, NODE_TARGET, PRUNING_WARMUP, PRUNING_LR_LAMBDA, LR_CONSTANTS, UGS_SAMPLES,
                              INIT_STD, REPEAT_FRACTION, WARMUP_STEPS, D_MLP, MIN_LR_RATIO, VERIFY_BUDGET)}
"""Every Param by its name: a command's option or an estimator's parameter of that name takes its default and bounds
(tests/pipelines/test_param_defaults.py)."""


def tail_resamples(confidence_level: float) -> int:
    """Return the fewest resamples a two-sided interval at ``confidence_level`` needs: one beyond each quantile."""
    # 2 / alpha resamples put B * alpha / 2 = 1 resample in each tail; round away float noise
    return int(math.ceil(2.0 / (1.0 - confidence_level) - 1e-9))


def resamples_for_level(n_resamples: int, confidence_level: float, what: str = "n_resamples") -> int:
    """``n_resamples`` when a two-sided interval at ``confidence_level`` has a resample beyond each quantile
    (:func:`tail_resamples`, and at least the Param's minimum); InputError naming the fewest that do otherwise."""
    need = max(int(N_RESAMPLES.minimum), tail_resamples(confidence_level))
    if n_resamples < need:
        raise InputError(f"{what}={n_resamples} is too few for a {confidence_level:.3g} interval: use at least {need} "
                         "(one resample beyond each quantile)")
    return n_resamples
