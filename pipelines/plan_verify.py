"""The verified run's lines of a plan (docs/verified.md "What it costs"): its two phases against exact patching on all
prompts, for the uniform and the active design, and the largest run of each within a share of exact's FLOPs."""

from __future__ import annotations

from .plan_fit import duration

__all__ = ["verify_lines", "active_verify_lines", "verify_share_lines"]


def verify_lines(model, costs: dict, verify, method: str, *, n: int, P: int, batch_size: int, seconds) -> list[str]:
    """The verified run's lines: phase 1 (``method`` on all n), phase 2 (exact on verify.n of them), their sum,
    and the sum against exact patching on all n (circuits.plan.verify_cost; ``seconds(cost)`` prices a Cost)."""
    from circuitstat.circuits.plan import verify_cost

    p1, exact = costs.get(method), costs.get("exact")
    if p1 is None or exact is None:
        return [f"verified run: not priced ({method} or exact is not in the plan)"]
    if verify.design == "active":
        return active_verify_lines(model, p1, exact, verify, method, n=n, P=P, seconds=seconds)
    k = None if verify.edges is None else verify.edges.top + verify.edges.random
    p2 = verify_cost(model.cfg, n=verify.n, N=n, positions=P, n_edges=k, batch_size=exact.batch_size,
                     max_rows=exact.max_rows, itemsize=model.dtype.itemsize)
    (t1, pre), (t2, _), (te, _) = seconds(p1), seconds(p2), seconds(exact)
    edges = "every edge" if k is None else f"the top {verify.edges.top} + {verify.edges.random} random edges"
    return [f"verified run: {method} on all {n} prompts, then exact on {verify.n} of them ({edges})",
            f"  phase 1  {method:<17} FLOPs {p1.flops:>9.3g}  est. time {pre + duration(t1):>10}",
            f"  phase 2  {'exact on ' + str(verify.n):<17} FLOPs {p2.flops:>9.3g}  est. time {pre + duration(t2):>10}",
            f"  both     {'':<17} FLOPs {p1.flops + p2.flops:>9.3g}  est. time {pre + duration(t1 + t2):>10}  "
            f"= {(p1.flops + p2.flops) / exact.flops:.1%} of exact on all {n} by FLOPs "
            f"({exact.flops:.3g}), {(t1 + t2) / te:.1%} by time ({pre + duration(te)})"]


def _largest_within(fits, low: int, high: int) -> int | None:
    """Return the largest integer x in [low, high] with fits(x) true (fits is monotone: true up to some x), or None."""
    if high < low or not fits(low):
        return None
    while low < high:  # invariant: fits(low)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def verify_share_lines(model, costs: dict, method: str, share: float, *, n: int, P: int) -> list[str]:
    """The largest verified run of each design whose two phases cost at most ``share`` of exact patching on all n
    prompts by FLOPs: uniform n prompts (circuits.plan.verify_cost) and active budget B cells per edge
    (pipelines.verify.active_phase2_cost, at the upper bound of its forwards); a line saying none fits otherwise."""
    from circuitstat.circuits.plan import verify_cost
    from circuitstat.pipelines.verify import active_phase2_cost

    p1, exact = costs.get(method), costs.get("exact")
    if p1 is None or exact is None:
        return [f"verified runs within {share:.1%} of exact: not priced ({method} or exact is not in the plan)"]
    kw = dict(max_rows=exact.max_rows, itemsize=model.dtype.itemsize)
    uniform = lambda k: p1.flops + verify_cost(model.cfg, n=k, N=n, positions=P, batch_size=exact.batch_size,  # noqa: E731
                                               **kw).flops
    active = lambda b: p1.flops + active_phase2_cost(model.cfg, b, N=n, positions=P, n_methods=1,  # noqa: E731
                                                     batch_size=exact.batch_size, **kw)[0].flops
    cap = share * exact.flops
    k = _largest_within(lambda x: uniform(x) <= cap, 4, n - 2)  # the bounds check_verify enforces on --verify
    b = _largest_within(lambda x: active(x) <= cap, 4, n)
    head = f"verified runs within {share:.1%} of exact on all {n} by FLOPs ({method} on all {n} alone: " \
           f"{100 * p1.flops / exact.flops:.3g}%)"
    if k is None and b is None:
        return [f"{head}: none fits; the smallest (--verify 4) costs {uniform(4) / exact.flops:.1%}"]
    out = [head + ":"]
    if k is not None:
        out.append(f"  uniform  --verify {k:<6}  {uniform(k) / exact.flops:.1%} of exact  (exact on {k} of {n} "
                   "prompts, every edge)")
    if b is not None:
        out.append(f"  active   --verify-design active --verify-budget {b}  {active(b) / exact.flops:.1%} of exact  "
                   f"({b} expected exact cells per edge)")
    else:  # its cells spread over nearly every prompt, so nearly every batch runs its forwards
        out.append(f"  active   none fits: the smallest (--verify-budget 4) costs {active(4) / exact.flops:.1%} (the "
                   "forwards of nearly every batch)")
    return out + ["  which design is narrower depends on how well the method predicts exact per prompt, known only "
                  "after phase 1 (docs/verified.md: active 1.45x-1.49x against uniform 1.53x-1.64x exact on all N "
                  "at 10% of the cells on the zoo and planted pairs)"]


def active_verify_lines(model, p1, exact, verify, method: str, *, n: int, P: int, seconds) -> list[str]:
    """The active design's verified-run lines: phase 1 (``p1``, ``method`` on all n), phase 2 (budget x edges expected
    cells, priced at the upper bound of the batches holding one: pipelines.verify.active_phase2_cost) and their share
    of exact patching on all n (``exact``) for this model."""
    from circuitstat.pipelines.verify import active_phase2_cost

    p2, (low, high) = active_phase2_cost(model.cfg, verify.budget, N=n, positions=P, n_methods=1,
                                         batch_size=exact.batch_size, max_rows=exact.max_rows,
                                         itemsize=model.dtype.itemsize)
    (t1, pre), (t2, _), (te, _) = seconds(p1), seconds(p2), seconds(exact)
    E = model.graph.n_edges
    return [f"verified run (active design): {method} on all {n} prompts, then exact on {verify.budget:g} expected "
            f"(prompt, edge) cells per edge ({p2.suffix_rows:,} suffix rows of exact's {exact.suffix_rows:,})",
            f"  phase 1  {method:<17} FLOPs {p1.flops:>9.3g}  est. time {pre + duration(t1):>10}",
            f"  phase 2  {'exact on cells':<17} FLOPs {p2.flops:>9.3g}  est. time {pre + duration(t2):>10}  "
            f"(forwards of the batches holding a sampled prompt: {low:.4g} to {high:.4g} of {n} prompts expected, "
            "priced at the upper)",
            f"  both     {'':<17} FLOPs {p1.flops + p2.flops:>9.3g}  est. time {pre + duration(t1 + t2):>10}  "
            f"= {(p1.flops + p2.flops) / exact.flops:.1%} of exact on all {n} by FLOPs "
            f"({exact.flops:.3g}; phase 2 alone {p2.flops / exact.flops:.1%}, its cells {verify.budget / n:.1%} of "
            f"exact's {E:,} x {n}), {(t1 + t2) / te:.1%} by time ({pre + duration(te)})"]
