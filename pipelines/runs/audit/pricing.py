"""What an audit costs before it runs: each stage's forwards and FLOPs, priced as ``attribute --plan`` prices a
forward (upper bounds where a stage's work depends on its data), summed by circuitstat.pipelines.runs.audit.stages.audit_flops for the run-kind
registry and the service's ``max_work_flops``."""

from __future__ import annotations

from circuitstat.pipelines.spec import AuditSpec

__all__ = ["HEADS_PROBE_LEN", "HEADS_NULL_PERMUTATIONS", "FAITHFULNESS_PASSES", "heads_flops", "faithfulness_forwards",
           "faithfulness_flops", "tests_forwards", "tests_flops"]


HEADS_PROBE_LEN = 64  # HeadStability's default probe length (min(64, n_ctx)) when probe_len is unset
HEADS_NULL_PERMUTATIONS = 50  # its prompts null's default n_null


def heads_flops(spec: AuditSpec, cfg) -> float:
    """The head-stability stage's FLOPs on the spec's models (each of config ``cfg``); 0 with one model. Each model's
    forward over the probe set (2 FLOPs per weight per token, plus QK and AV), then every compared pair's attention
    patterns matched head by head (H x H similarities over n_probe x T x T values per layer), for the refits and
    again for each permutation of the prompts null (circuitstat.pipelines.runs.heads.stability)."""
    K = len(spec.sources)
    if K < 2:
        return 0.0
    h = spec.heads
    T = min(HEADS_PROBE_LEN, cfg.n_ctx)
    weights = cfg.n_layers * (4 * cfg.d_model * cfg.n_heads * cfg.d_head + 3 * cfg.d_model * cfg.d_mlp)
    forward = K * h.n_probe * T * (2 * weights + 4 * cfg.n_layers * cfg.n_heads * cfg.d_head * T)
    pairs = K * (K - 1) if h.pairs == "all" else K - 1
    match = pairs * cfg.n_layers * cfg.n_heads ** 2 * h.n_probe * T * T * 2
    return float(forward + match * (1 + HEADS_NULL_PERMUTATIONS))


FAITHFULNESS_PASSES = 3  # the curve over every prompt, then the cross-fitting's 2 repeats (each prompt held out once)


def faithfulness_forwards(spec: AuditSpec) -> int:
    """Upper bound on the example forwards of the faithfulness stage of ``spec``, per method: each pass runs, per batch,
    the clean, the fully patched and the counterfactual run plus one patched run per circuit, over every prompt; each
    extra k of the circuit choice's search (at most ``k_search``, below the grid's largest k) is one more circuit."""
    C, extra = len(spec.k), min(spec.k_search, max(spec.k))
    return FAITHFULNESS_PASSES * spec.task.n * ((C + 3) + 4 * extra)


def faithfulness_flops(spec: AuditSpec, cfg) -> float:
    """The faithfulness stage's FLOPs on a model of config ``cfg``: :func:`faithfulness_forwards` full forwards per
    method (a verified method's circuits too), priced as ``--plan`` prices a forward; 0 without the stage."""
    if not spec.faithfulness:
        return 0.0
    from circuitstat.circuits.plan import forward_flops
    from circuitstat.pipelines.build import task_positions

    positions = task_positions(spec.task.name, spec.task.options or {}) or min(int(cfg.n_ctx), 64)
    methods = len(spec.methods) + (0 if spec.verify is None or spec.verify.edges is not None
                                   or spec.verify.design == "active"  # no +verified circuits: no pseudo-scores
                                   else sum(m != "exact" for m in spec.methods))
    return float(methods * faithfulness_forwards(spec) * forward_flops(cfg, positions))


def tests_forwards(spec: AuditSpec) -> int:
    """Upper bound on the example forwards of the circuit_tests stage of ``spec`` (0 without it): the faithfulness
    engine runs, per batch, the clean, fully patched and counterfactual runs plus one run per layout circuit
    (circuitstat.pipelines.circuit_tests.CircuitLayout: the circuit, its complement, K minus-one, n_random inflated,
    inflated-minus-one, random and random-complement circuits), on the testing rows: a half of the prompts when the circuit is chosen on
    the other half (bounded by every prompt, as templates kept whole can make the halves uneven), every prompt for
    given edges."""
    if spec.tests is None:
        return 0
    t = spec.tests
    K = int(t.k) if t.k is not None else len(t.edges or [])
    return spec.task.n * ((2 + K + 4 * t.n_random) + 3)


def tests_flops(spec: AuditSpec, cfg) -> float:
    """The circuit_tests stage's FLOPs on a model of config ``cfg``: :func:`tests_forwards` full forwards priced as
    ``--plan`` prices a forward; 0 without the stage."""
    if spec.tests is None:
        return 0.0
    from circuitstat.circuits.plan import forward_flops
    from circuitstat.pipelines.build import task_positions

    positions = task_positions(spec.task.name, spec.task.options or {}) or min(int(cfg.n_ctx), 64)
    # the independence test's permutations: one [n, n] Gram product per permutation on the testing rows (at most
    # every prompt), circuitstat.stats.circuit_tests.independence_test
    permutations = 3.0 * spec.tests.n_permutations * spec.task.n ** 2
    return float(tests_forwards(spec) * forward_flops(cfg, positions)) + permutations
