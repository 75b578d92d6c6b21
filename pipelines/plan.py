"""``circuitstat attribute --plan``: each method's cost on this model, task and machine, before running it.

The counts come from circuits.plan (shape arithmetic). The time is priced by a short calibration on
the actual model and a batch of the actual task: a full batch forward (dominated by FLOPs) and a
one-token forward (dominated by per-layer overhead) give seconds per FLOP and seconds per layer
pass, and each method's estimate is ``flops x s/FLOP + layer_passes x s/pass``. Both are timed
single-threaded, as the attribute command computes (so scores never depend on the thread count).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from circuits.plan import METHODS, Cost, fit_memory, forward_flops, method_cost


@dataclass(frozen=True)
class Calibration:
    """Seconds per FLOP and per layer pass on this machine, from timed forwards of the model."""

    seconds_per_flop: float
    seconds_per_pass: float
    batch_forward_s: float  # one forward of the calibration batch
    batch_size: int

    def seconds(self, cost: Cost) -> float:
        """The estimated single-worker time of ``cost``."""
        return cost.flops * self.seconds_per_flop + cost.layer_passes * self.seconds_per_pass


def _best_time(fn, repeats: int) -> float:
    """The shortest of ``repeats`` timings of ``fn()`` after one warm-up call (the least disturbed one)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate(model, data, batch_size: int, *, repeats: int = 5) -> Calibration:
    """A Calibration from timed forwards of ``model`` on the first ``batch_size`` examples of ``data``."""
    import torch

    from circuits.ablation import last_index

    from .parallel import single_threaded

    cfg, dev = model.cfg, model.device
    B = min(batch_size, int(data.clean.shape[0]))
    ids, mask = data.clean[:B].to(dev), data.attention_mask[:B].to(dev)
    last = last_index(mask)
    one, one_mask = ids[:1, :1], mask[:1, :1]
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    with torch.no_grad(), single_threaded():
        big = _best_time(lambda: model.run(ids, mask, logits_at=last), repeats)
        small = _best_time(lambda: model.run(one, one_mask, logits_at=zero), repeats)
    f_big = B * forward_flops(cfg, int(ids.shape[1]), fast_last=True)
    f_small = forward_flops(cfg, 1, fast_last=True)
    per_flop = max(big - small, 0.0) / max(f_big - f_small, 1)
    per_pass = max(small - per_flop * f_small, 0.0) / cfg.n_layers
    return Calibration(per_flop, per_pass, big, B)


def plan_costs(model, data, *, level: str = "edge", batch_size: int = 16, ig_steps: int = 5,
               budget: int | None = None, methods=METHODS) -> list[Cost]:
    """Each method's Cost on ``data`` (batch size and exact's rows fitted to ``budget`` bytes when given)."""
    cfg = model.cfg
    n, P = int(data.clean.shape[0]), int(data.clean.shape[1])
    itemsize = model.dtype.itemsize
    costs = []
    for method in methods:
        b, rows = batch_size, 256
        if budget is not None:
            widest = batch_size * int(model.graph.n_upstream.max())
            b, rows = fit_memory(cfg, method, budget, positions=P, level=level, batch_size=batch_size,
                                 max_rows=widest, itemsize=itemsize)
        costs.append(method_cost(cfg, method, n=n, positions=P, level=level, batch_size=b, ig_steps=ig_steps,
                                 max_rows=rows, itemsize=itemsize))
    return costs


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def plan_lines(model, data, *, level: str = "edge", batch_size: int = 16, ig_steps: int = 5,
               budget: int | None = None, n_jobs: int = 1) -> list[str]:
    """The plan as printed lines: one header, one calibration line, one row per method."""
    from circuits.limits import format_bytes

    n, P = int(data.clean.shape[0]), int(data.clean.shape[1])
    cal = calibrate(model, data, batch_size)
    costs = plan_costs(model, data, level=level, batch_size=batch_size, ig_steps=ig_steps, budget=budget)
    unit = "edges" if level == "edge" else "nodes"
    lines = [f"plan: {n} examples x {P} positions, {costs[0].columns:,} {unit}, ig steps {ig_steps}, "
             f"{n_jobs} worker{'s' if n_jobs > 1 else ''}",
             f"calibration: one forward of {cal.batch_size} examples takes {cal.batch_forward_s * 1e3:.3g} ms "
             f"({cal.seconds_per_flop * 1e12:.3g} ms per TFLOP, {cal.seconds_per_pass * 1e6:.3g} us per layer pass; "
             "one thread per worker)",
             f"{'method':<19} {unit:>8} {'forwards':>9} {'backwards':>9} {'suffix rows':>12} {'FLOPs':>9} "
             f"{'memory':>10} {'batch':>5} {'est. time':>10}"]
    for c in costs:
        chunks = -(-n // c.batch_size)
        est = cal.seconds(c) / min(n_jobs, chunks)
        lines.append(f"{c.method:<19} {c.columns:>8,} {c.forwards:>9,} {c.backwards:>9,} {c.suffix_rows:>12,} "
                     f"{c.flops:>9.3g} {format_bytes(c.memory_peak):>10} {c.batch_size:>5} {_duration(est):>10}")
    lines.append("forwards: full forwards (counterfactual, clean, gradient runs); suffix rows: exact patching's "
                 "(example, sender) suffix forwards; memory: estimated peak incl. weights")
    return lines
