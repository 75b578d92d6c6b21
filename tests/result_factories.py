"""One small, real instance of every Result class (tests/test_results_contract.py runs the contract on each).

Each factory runs the estimator that produces the result on tiny inputs (synthetic arrays, or a
random 2-layer model for the results that need one), so a factory breaks when its estimator does.
A new Result class needs a factory here: the contract test fails for a class it cannot build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

RNG = np.random.default_rng(0)
N, E = 24, 10


def _scores() -> np.ndarray:
    return (np.linspace(2, -1, E) + RNG.standard_t(4, (N, E))).astype(np.float32)


def _plan(n: int = N, b: int = 200, seed: int = 1):
    from circuitstat.stats.resampling import ResamplingPlan

    return ResamplingPlan.bootstrap(n, b, seed)


def _model(seed: int = 0, n_layers: int = 2, n_heads: int = 2):
    import torch

    from circuitstat.circuits.model import CircuitModel, ModelConfig

    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=16)
    m = CircuitModel(cfg).init_weights(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(6.0) if p.ndim > 1 else None  # sharper attention than the default init
    return m.eval().requires_grad_(False)


def _task(model, n: int = 8):
    from circuitstat.pipelines.build import build_task

    return build_task(model, "induction", n=n, seed=0, seq_len=5)


def bootstrap() -> Any:
    from circuitstat.stats.intervals import bootstrap_edges

    return bootstrap_edges(_scores(), _plan(), methods=["percentile", "bca"])


def edge_tests() -> Any:
    from circuitstat.stats.testing import t_test_edges

    return t_test_edges(_scores())


def stability() -> Any:
    from circuitstat.stats.stability import circuit_stability

    return circuit_stability(_scores(), ks=[2, 4], ranking="absolute", n_resamples=60, seed=0)


def approximation() -> Any:
    from circuitstat.stats.approximation import approximation_agreement

    s = _scores()
    return approximation_agreement(s, s + 0.1 * RNG.standard_normal(s.shape), 3, ranking="absolute", seed=0)


def variance() -> Any:
    from circuitstat.stats.variance import variance_components

    return variance_components(RNG.standard_normal((6, 4, 5)), ["examples", "counterfactual"])


def icc() -> Any:
    from circuitstat.stats.variance import icc

    return icc(RNG.standard_normal((8, 3, 4)) + RNG.standard_normal((8, 1, 4)))


def calibration() -> Any:
    from circuitstat.stats.calibration import IntervalKind, coverage_study
    from circuitstat.stats.intervals import bootstrap_edges
    from circuitstat.stats.resampling import ResamplingPlan

    pop = RNG.standard_normal((200, 3))

    def interval(X: np.ndarray, seed) -> dict:
        r = bootstrap_edges(X, ResamplingPlan.bootstrap(X.shape[0], 50, seed), method="percentile")
        return {"low": r.confidence_interval.low, "high": r.confidence_interval.high}

    kind = IntervalKind("edge/percentile", "the mean", interval, truth=lambda n: pop.mean(0))
    return coverage_study(pop, [10], [kind], n_datasets=20, seed=0)


def fixed_faithfulness() -> Any:
    from circuitstat.stats.faithfulness import fixed_circuit_interval

    m_clean = 2 + RNG.standard_normal(N)
    m_empty = RNG.standard_normal(N) * 0.1
    m_circuit = np.stack([m_empty + f * (m_clean - m_empty) + 0.1 * RNG.standard_normal(N) for f in (0.5, 0.9)], 1)
    return fixed_circuit_interval(m_circuit, m_clean, m_empty, _plan(), methods=["percentile"], k=[2, 4])


def similarity() -> Any:
    from circuitstat.stats.similarity import similarity_test

    X = RNG.standard_normal((20, 4))
    return similarity_test(X, X + RNG.standard_normal((20, 4)), n_permutations=40, seed=0)


def _patterns(h: int = 3, p: int = 6, t: int = 5) -> np.ndarray:
    a = np.tril(RNG.random((h, p, t, t)) ** 4) + 1e-3 * np.tril(np.ones((t, t)))
    return a / a.sum(-1, keepdims=True)


def head_match() -> Any:
    from circuitstat.stats.similarity import head_matching

    return head_matching(_patterns(), _patterns(), n_permutations=20, n_resamples=40, seed=0)


def _sink_inputs():
    names = ["a0.h0", "a0.h1", "a1.h0", "a1.h1"]
    share = RNG.random((N, 4)) * np.array([0.9, 0.2, 0.6, 0.1])
    norm = 1 + 2 * share + 0.1 * RNG.standard_normal((N, 4))
    return names, share, norm


def sinks() -> Any:
    from circuitstat.stats.sinks import sink_relation

    names, share, norm = _sink_inputs()
    return sink_relation(share, norm, names, gap=0.1 * RNG.standard_normal((N, 4)), n_resamples=200, seed=0)


def token_importance() -> Any:
    from circuitstat.stats.token_importance import token_importance_faithfulness

    drops = RNG.standard_normal((N, 3, 2)) + np.array([1.0, 0.5, 0.0])[None, :, None]
    return token_importance_faithfulness(drops, ["contribution", "attention", "random"], [1, 2], n_resamples=200,
                                         seed=0)


def token_stability() -> Any:
    from circuitstat.stats.token_importance import token_stability

    cand = np.ones((6, 5), bool)
    orders = {"attention": np.stack([np.stack([RNG.permutation(5) for _ in range(6)]) for _ in range(3)])}
    return token_stability(orders, cand, [1, 2])


def contributions() -> Any:
    from circuitstat.pipelines.runs.tokens.run import ContributionsResult

    return ContributionsResult(token_importance(), sinks(), {"estimator": "TokenContributions",
                                                              "confidence_level": 0.95})


def cross_seed() -> Any:
    from circuitstat.pipelines.runs.tokens.run import CrossSeedResult
    from circuitstat.stats.sink_matching import sink_matching
    from circuitstat.stats.sinks import sink_stability

    rates = RNG.random((3, 2, 2))
    sinks_table = sink_stability(rates, RNG.standard_normal(3), RNG.standard_normal(3), sink_bar=0.3)
    match = np.stack([np.stack([np.stack([RNG.permutation(2) for _ in range(2)]) for _ in range(3)])
                      for _ in range(3)])
    matching = sink_matching(rates, match, sink_bar=0.3)
    return CrossSeedResult([contributions()], token_stability(), sinks_table, matching, {"confidence_level": 0.95})


def faithfulness_curve() -> Any:
    from circuitstat.circuits.faithfulness import faithfulness_curve

    model = _model()
    scores = RNG.standard_normal(model.graph.n_edges).astype(np.float32)
    return faithfulness_curve(model, _task(model), scores, ranking="absolute", ks=[5, 20], fractions=None,
                              progress=False)


def head_stability() -> Any:
    from circuitstat.pipelines.runs.heads.stability import HeadStability

    models = [_model(s) for s in range(3)]
    ids = RNG.integers(0, 50, (10, 8))
    return HeadStability(n_resamples=20, n_null=3, n_permutations=99, cka=("linear",), seed=0).fit(
        models, probe=ids).result_


def score_matrix() -> Any:
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.circuits.scores import ScoreMatrix

    g = ComponentGraph(2, 2)
    return ScoreMatrix(RNG.standard_normal((5, g.n_edges)).astype(np.float32), g, "edge", "eap", "counterfactual",
                       "logit_diff")


def circuit() -> Any:
    from circuitstat.circuits.circuit import Circuit

    sm = score_matrix()
    return Circuit.top_k(sm, 5, ranking="absolute")


def _run_tables(cls: type, tmp: Path) -> Any:
    from circuitstat.core.rundir import RunDir
    from circuitstat.core.schema import fill

    run_dir = tmp / "study"
    with RunDir(run_dir, spec={"study": "fixture"}) as run:
        run.write_table("summary", fill("summary", {"item": ["a", "b"], "value": [0.5, 0.7], "ci_low": [0.4, 0.6],
                                                    "ci_high": [0.6, 0.8], "verdict": ["met", "met"]}, 2))
    return cls(run_dir, ("summary",), params={"confidence_level": 0.95})


def run_tables(tmp: Path) -> Any:
    from circuitstat.core.run_tables import RunTables

    return _run_tables(RunTables, tmp)


def head_study(tmp: Path) -> Any:
    from circuitstat.pipelines.runs.heads.study import HeadStudyResult

    return _run_tables(HeadStudyResult, tmp)


#: Result class name -> factory (factories taking a path get a temporary directory)
def verified() -> Any:
    from circuitstat.stats.verified import verified_means

    exact_all = _scores().astype(np.float64)
    approx = 0.8 * exact_all + 0.3 * RNG.standard_normal(exact_all.shape)
    rows = RNG.choice(N, 8, replace=False)
    return verified_means(approx, exact_all[rows], rows, edge_names=[f"e{i}" for i in range(E)])


def verified_multi() -> Any:
    from circuitstat.stats.verified import verified_means_multi

    exact_all = _scores().astype(np.float64)
    approx = {"eap": 0.8 * exact_all + 0.3 * RNG.standard_normal(exact_all.shape),
              "atp-qkfix": 0.9 * exact_all + 0.2 * RNG.standard_normal(exact_all.shape)}
    rows = RNG.choice(N, 8, replace=False)
    return verified_means_multi(approx, exact_all[rows], rows, edge_names=[f"e{i}" for i in range(E)])


def active_verified() -> Any:
    from circuitstat.stats.verified import active_probabilities, active_sample, active_verified_means

    exact_all = _scores().astype(np.float64)
    approx = 0.8 * exact_all + 0.3 * RNG.standard_normal(exact_all.shape)
    p = active_probabilities(approx, 8)
    return active_verified_means(approx, exact_all, active_sample(p, 0), p, budget=8,
                                 edge_names=[f"e{i}" for i in range(E)])


def missed_edges() -> Any:
    from circuitstat.stats.verified import missed_edges_bound

    return missed_edges_bound(np.array([True, False, False, False]), 40, tau=0.5, n_top=5,
                              confidence_level=0.975, classification_level=0.975)


def sample_size() -> Any:
    from circuitstat.circuits.graph import ComponentGraph
    from circuitstat.pipelines.claims.parsing import parse_claims
    from circuitstat.pipelines.runs.sample_size.simulate import cost_rows, sample_size as predict
    from circuitstat.pipelines.sources import LOCAL

    g = ComponentGraph(1, 2)
    S = RNG.standard_normal((20, g.n_edges))
    claims = parse_claims({"claims": [{"kind": "faithfulness", "method": "eap", "k": 3, "statistic": "f_ci_low",
                                       "min": 0.5}]})  # not simulated: a NaN row with its reason, no simulation
    cfg = LOCAL.skeleton("random:gpt2?n_layer=1&n_head=2&n_embd=16&vocab_size=64&n_positions=32&seed=1").cfg
    return predict(S, g.edge_names, "eap", [16, 24], [3], 0.5, claims=claims, n_datasets=2, seed=0,
                   cost=cost_rows(cfg, [16, 24], 8, ["exact", "eap"], 1.0))


FACTORIES: dict[str, Callable[..., Any]] = {
    "SampleSizeResult": sample_size,
    "VerifiedResult": verified, "VerifiedResult/several predictors": verified_multi,
    "ActiveVerifiedResult": active_verified, "MissedEdgesResult": missed_edges,
    "BootstrapResult": bootstrap, "EdgeTestResult": edge_tests, "StabilityResult": stability,
    "ApproximationResult": approximation, "VarianceComponentsResult": variance, "ICCResult": icc,
    "CalibrationResult": calibration, "FaithfulnessInterval": fixed_faithfulness, "SimilarityResult": similarity,
    "HeadMatchResult": head_match, "SinkResult": sinks, "TokenImportanceResult": token_importance,
    "TokenStabilityResult": token_stability, "ContributionsResult": contributions, "CrossSeedResult": cross_seed,
    "FaithfulnessResult": faithfulness_curve, "HeadStabilityResult": head_stability, "ScoreMatrix": score_matrix,
    "Circuit": circuit, "RunTables": run_tables, "HeadStudyResult": head_study,
}
NEEDS_PATH = {"RunTables", "HeadStudyResult"}
