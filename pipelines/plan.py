"""``circuitstat attribute --plan``: each method's cost on this model, task and machine, before running it.

The counts come from circuitstat.circuits.plan (shape arithmetic). The time comes from a short calibration on
the actual model and a batch of the actual task, timing the passes the methods are made of:

* a forward keeping the sender outputs (the counterfactual and clean runs of every method);
* a gradient run (forward with per-head receiver inputs, then the backward), plain and with a
  sender intervention (EAP-IG's interpolated runs);
* a suffix run from every layer on a full batch of rows and on one row (exact patching: per call
  overhead and per row cost of a suffix starting at each layer);
* the edge contraction Σ_pos Δz_u · ∂m/∂in_v of the batch (memory-bound: priced as timed, not by FLOPs);
* on models where it is quick (predicted under 2 s), exact patching of one example, whose excess
  over the suffix runs is exact's per-receiver-call overhead (gathers, the patched layer, Python).

Each method's estimate is its count of each pass times the pass's time (per example where the
work scales with rows).  A model on the meta device (shapes only, no weights: a multi-billion-parameter
config planned on any machine) cannot be timed: its estimate is its FLOPs at a matrix-multiply rate --
the device's dense datasheet peak for a known GPU, else the rate of a timed matmul on the planning
machine -- a lower bound that leaves out per-call overhead and memory-bound work. Everything is timed single-threaded, as the attribute command computes, and
each timing is the fastest of a few repeats (the least disturbed on a shared machine).

On a CPU the passes are timed in the process's CPU time, not wall time: on a loaded machine wall time counts
the time other processes held the core (a GPT-2-small plan calibrated at load 6-13 on 2 cores priced exact at
21 h against 2.9 h measured idle, issue 38). The plan prints the machine's load average and the ratio of wall
to CPU time while it calibrated (how much longer a run would take under that load), and how many model passes
the calibration itself ran (its own cost). On a GPU the passes are timed in wall time (the work is not the CPU's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from circuitstat.circuits.methods import method as method_record, methods_for
from circuitstat.circuits.plan import (METHODS, Cost, contraction_flops, fit_memory, method_cost, pass_counts,
                                       qk_fix_flops)
from circuitstat.core.params import BATCH_SIZE, IG_STEPS, N_JOBS

from .plan_fit import TIMING_BYTES, Limits, duration, fit_mark, limits_line, run_limits  # noqa: F401 - TIMING_BYTES re-exported


@dataclass(frozen=True)
class Calibration:
    """Timed passes of the model on a batch of ``batch_size`` examples (seconds, one thread)."""

    batch_size: int
    forward_s: float  # forward keeping the sender outputs
    gradient_s: float  # forward with receiver inputs + backward
    ig_gradient_s: float  # the same with a sender intervention
    suffix_s: tuple[tuple[float, float], ...]  # per start layer (0..L-1): (seconds per call, seconds per row)
    patch_call_s: float = 0.0  # exact's extra cost per receiver call (gathers, patched layer), from a probe
    contraction_s: float = 0.0  # Σ_pos Δz_u · g_v for every edge of the batch
    mask_step_s: float = 0.0  # a mask fit's masked run and its backward to the mask (0: not timed)
    clock: str = "CPU time"  # what the seconds are: "CPU time" (on a CPU) or "wall time" (on a GPU)
    passes: int = 0  # model passes (CircuitModel.run calls) the calibration itself ran
    wall_s: float = 0.0  # the calibration's own wall time
    cpu_s: float = 0.0  # and its CPU time (wall_s / cpu_s > 1: other processes held the cores)
    load: float | None = None  # 1-minute load average when the calibration ended
    cores: int = 1  # cores this process may run on

    def suffix_call(self, layer: int, rows: int) -> float:
        """One suffix run of ``rows`` rows from ``layer`` on (the logits receiver: priced as the last layer)."""
        call, row = self.suffix_s[min(layer, len(self.suffix_s) - 1)]
        return self.patch_call_s + call + row * rows


# Dense (not sparse) tensor-core peaks from the vendors' datasheets, TFLOP/s: (bf16/fp16, fp32 without TF32).
PEAKS = {"H200": (989.0, 67.0), "H100 PCIe": (756.0, 51.0), "H100": (989.0, 67.0), "A100": (312.0, 19.5),
         "L40S": (362.0, 91.6), "L4": (121.0, 30.3), "RTX 4090": (165.0, 82.6), "T4": (65.0, 8.1)}


def peak_tflops(device_name: str, dtype) -> float | None:
    """The dense datasheet peak of a GPU named ``device_name`` for ``dtype`` (None when unknown)."""
    import torch

    for key in sorted(PEAKS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in device_name:
            return PEAKS[key][0 if dtype in (torch.bfloat16, torch.float16) else 1]
    return None


def flop_rate(device: str, dtype, size: int = 1024) -> tuple[float, str]:
    """(TFLOP/s, how it was found) for pricing FLOPs on ``device``: a known GPU's peak, else a timed
    ``size``-square matmul of ``dtype`` there (one thread on a CPU, as the attribute command computes)."""
    import torch

    from .parallel import single_threaded

    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        peak = peak_tflops(name, dtype)
        if peak is not None:
            return peak, f"{name} dense peak"
    a = torch.randn(size, size, device=dev).to(dtype)
    with single_threaded():
        seconds = _best_time(lambda: (a @ a).sum().item(), 3, clock_for(dev)[1])
    return 2 * size ** 3 / seconds / 1e12, f"a timed {size}x{size} {str(dtype).replace('torch.', '')} matmul on {dev.type}"


LONG_PASS_S = 0.25
"""A pass this long is timed by its first call, with no warm-up or repeat: its first-call overhead and timing
noise are small against it, and repeating the passes of a GPT-2-small-sized model made ``--plan`` take
minutes (issues 23, 38)."""


def clock_for(device) -> "tuple[str, Callable[[], float]]":
    """(name, clock) timing passes on ``device``: the process's CPU time on a CPU (with one thread, the
    time the pass needs whatever else runs on the machine), wall time on an accelerator."""
    import torch

    if torch.device(device).type == "cpu":
        return "CPU time", time.process_time
    return "wall time", time.perf_counter


def _best_time(fn, repeats: int, clock: "Callable[[], float]" = time.process_time) -> float:
    """The shortest of ``repeats`` timings of ``fn()`` by ``clock`` after one warm-up call (the least disturbed
    one); the warm-up's own timing when it took LONG_PASS_S or more."""
    t0 = clock()
    fn()
    best = clock() - t0
    if best >= LONG_PASS_S:
        return best
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def calibration_batch(model, data, batch_size: int) -> int:
    """Examples to calibrate on: ``batch_size``, or fewer (but 2, which the suffix runs' per-row cost needs)
    when one forward of them would take over LONG_PASS_S: per-example costs are what the estimate uses,
    and a large model's full batch adds only time (minutes on GPT-2 small, issue 23)."""
    import torch

    from .parallel import single_threaded

    ids, mask = data.clean[:1].to(model.device), data.attention_mask[:1].to(model.device)
    with single_threaded(), torch.no_grad():
        one = _best_time(lambda: model.run(ids, mask, compute_logits=False), 1, clock_for(model.device)[1])
    fits = max(2, int(LONG_PASS_S / max(one, 1e-9)))
    return max(1, min(batch_size, int(data.clean.shape[0]), fits))


def _suffix_times(model, ids, mask, last, resid_pre, repeats: int, rows: int) -> tuple[tuple[float, float], ...]:
    """(seconds per call, seconds per row) of a suffix run from each layer, from runs of 1 and ``rows`` rows
    (the first example repeated: a suffix's cost does not depend on the tokens).

    Timed from the first and the last layer only; the layers between are interpolated linearly, as a
    suffix from layer l runs L - l identical blocks and one unembedding (timing every start layer
    repeated the forward L times, minutes on GPT-2 small)."""
    from circuitstat.circuits.model import RunState

    L = model.cfg.n_layers
    many = (ids[:1].expand(rows, -1), mask[:1].expand(rows, -1), last[:1].expand(rows))
    clock = clock_for(model.device)[1]

    def timed(layer: int) -> tuple[float, float]:
        one_state, resid = RunState(layer, resid_pre[layer][:1]), resid_pre[layer][:1]
        many_state = RunState(layer, resid.expand(rows, *resid.shape[1:]))
        full = _best_time(lambda: model.run(many[0], many[1], state=many_state, logits_at=many[2]), repeats, clock)
        one = _best_time(lambda: model.run(ids[:1], mask[:1], state=one_state, logits_at=last[:1]), repeats, clock)
        row = max(full - one, 0.0) / max(rows - 1, 1)
        return max(one - row, 0.0), row

    first = timed(0)
    if L == 1:
        return (first,)
    end = timed(L - 1)
    return tuple(tuple(e + (f - e) * (L - 1 - layer) / (L - 1) for f, e in zip(first, end)) for layer in range(L))


@contextlib.contextmanager
def _counting_passes(model) -> Iterator[list[int]]:
    """Context counting ``model.run`` calls (the instance's, so exact's probe inside attribute() counts too)."""
    calls, own = [0], model.__dict__.get("run")  # an instance's own run (a caller's wrapper) is restored
    real = model.run

    def run(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    model.__dict__["run"] = run
    try:
        yield calls
    finally:
        if own is None:
            del model.__dict__["run"]
        else:
            model.__dict__["run"] = own


def calibrate(model, data, batch_size: int, *, repeats: int = 1, probe_s: float = 2.0,
              mask: bool = False) -> Calibration:
    """A Calibration from timed passes of ``model`` on the first ``batch_size`` examples of ``data`` (fewer
    on a large model: :func:`calibration_batch`, then rescaled to the batch by one timed forward of it), and
    exact patching of one example when that is predicted to take under ``probe_s`` seconds; with the
    calibration's own cost (model passes, wall and CPU time) and the machine's load while it ran.
    Each pass is timed once after a warm-up (``repeats``): CPU time is not disturbed by other processes as
    wall time is, so the fastest of several repeats is no longer needed. ``mask``: also time a mask fit's step
    (edge pruning, UGS: a masked run with per-head receiver inputs and its backward, :func:`_mask_step_time`)."""
    from circuitstat.circuits.threads import available_cores

    wall0, cpu0 = time.perf_counter(), time.process_time()
    with _counting_passes(model) as passes:
        cal = _calibrate(model, data, batch_size, repeats, probe_s, mask)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        load = None
    return dataclasses.replace(cal, clock=clock_for(model.device)[0], passes=passes[0],
                               wall_s=time.perf_counter() - wall0, cpu_s=time.process_time() - cpu0, load=load,
                               cores=available_cores())


def _calibrate(model, data, batch_size: int, repeats: int, probe_s: float, mask_step: bool = False) -> Calibration:
    """The timed passes of :func:`calibrate`."""
    import torch

    from circuitstat.circuits.ablation import last_index
    from circuitstat.circuits.contraction import edge_scores_from_grads
    from circuitstat.circuits.interventions import Intervention

    from .parallel import single_threaded

    g, dev = model.graph, model.device
    clock = clock_for(dev)[1]
    B = calibration_batch(model, data, batch_size)
    ids, mask = data.clean[:B].to(dev), data.attention_mask[:B].to(dev)
    last = last_index(mask)

    def gradient(intervention=None):
        with torch.enable_grad():
            # as circuitstat.circuits.attribution's gradient runs: probes on each head's q/k/v, mapped back to inputs
            out = model.run(ids, mask, intervention=intervention, receiver_grads="projected", logits_at=last,
                            keep_senders=intervention is None)
            return model.receiver_input_grads(out, torch.autograd.grad(out.logits[:, 0].sum(), out.grad_inputs))

    with single_threaded():
        with torch.no_grad():
            forward = _best_time(lambda: model.run(ids, mask, keep_senders=True, compute_logits=False), repeats, clock)
            clean = model.run(ids, mask, keep_resid=True, logits_at=last)
            cf = model.run(data.corrupted[:B].to(dev), mask, keep_senders=True, compute_logits=False).senders
            rows = max(B, min(batch_size, int(data.clean.shape[0])))  # exact's suffix calls hold many rows
            suffix = _suffix_times(model, ids, mask, last, clean.resid_pre, repeats, rows)
        grad = _best_time(gradient, repeats, clock)
        sm = torch.zeros(g.n_senders, device=dev)
        sm[0] = 0.5
        ig = _best_time(lambda: gradient(Intervention.nodes(sm, cf)), repeats, clock)
        grads = gradient()
        with torch.no_grad():
            delta = cf - model.run(ids, mask, keep_senders=True, compute_logits=False).senders
            contraction = _best_time(lambda: edge_scores_from_grads(model, delta, grads), repeats, clock)
        step = _mask_step_time(model, ids, mask, cf, repeats) if mask_step else 0.0
    cal = Calibration(B, forward, grad, ig, tuple(suffix), contraction_s=contraction, mask_step_s=step)
    return _probe_exact(_to_full_batch(cal, model, data, batch_size), model, data, probe_s)


def _mask_step_time(model, ids, mask, cf, repeats: int) -> float:
    """Time of one mask-fit step's model work on the batch: the masked run of every edge at gate 0.7
    (circuitstat.circuits.edge_pruning.masked_logits) and the backward of its logits to the gates."""
    import torch

    from circuitstat.circuits.edge_pruning import masked_logits

    keep = torch.full((model.graph.n_edges,), 0.7, device=model.device, requires_grad=True)

    def step():
        with torch.enable_grad():
            torch.autograd.grad(masked_logits(model, ids, mask, cf, keep)[:, 0].sum(), keep)

    return _best_time(step, repeats, clock_for(model.device)[1])


def _to_full_batch(cal: Calibration, model, data, batch_size: int) -> Calibration:
    """``cal``, timed on fewer examples than a batch, rescaled to the full batch by one timed forward of it:
    a larger batch runs more efficiently per example (on GPT-2 small 16 examples cost half as much each as
    2), and every gradient pass and the contraction are priced with that forward's ratio."""
    import torch

    from .parallel import single_threaded

    full = max(1, min(batch_size, int(data.clean.shape[0])))
    if full <= cal.batch_size:
        return cal
    ids, mask = data.clean[:full].to(model.device), data.attention_mask[:full].to(model.device)
    clock = clock_for(model.device)[1]
    with single_threaded(), torch.no_grad():
        t0 = clock()
        model.run(ids, mask, keep_senders=True, compute_logits=False)
        forward = clock() - t0
    grow = forward / cal.forward_s  # the batch's time over the calibration batch's (per-pass scale)
    # the suffix runs were timed on a full batch of rows already (_suffix_times)
    return dataclasses.replace(cal, batch_size=full, forward_s=forward, gradient_s=cal.gradient_s * grow,
                               ig_gradient_s=cal.ig_gradient_s * grow, contraction_s=cal.contraction_s * grow,
                               mask_step_s=cal.mask_step_s * grow)


def _probe_exact(cal: Calibration, model, data, probe_s: float) -> Calibration:
    """``cal`` with exact's per-call overhead measured by exact patching of one example, when the
    suffix timings predict that it takes under ``probe_s`` seconds (on large models the rows dominate)."""
    import dataclasses

    from circuitstat.circuits.attribution import attribute

    from .parallel import single_threaded

    g = model.graph
    calls = [(int(g.receiver_layer[r]), int(g.n_upstream[r])) for r in range(g.n_receivers)]
    predicted = 2 * cal.forward_s / cal.batch_size + sum(cal.suffix_call(layer, rows) for layer, rows in calls)
    if predicted > probe_s:
        return cal
    clock = clock_for(model.device)[1]
    with single_threaded():  # timed once: the model's passes were all warmed up by the calibration
        t0 = clock()
        attribute(model, data, "exact", rows=[0], batch_size=1, progress=False)
        measured = clock() - t0
    return dataclasses.replace(cal, patch_call_s=max(measured - predicted, 0.0) / len(calls))


def estimate_seconds(cal: Calibration, model, cost: Cost, *, n: int, level: str = "edge",
                     ig_steps: int = IG_STEPS.default, positions: int | None = None) -> float:
    """The single-worker time of ``cost`` on ``n`` examples, priced by ``cal``'s timed passes of the method's
    record (circuitstat.circuits.methods) (``positions``: the prompts' length, needed to price AtP*'s QK fix)."""
    per_example = 1.0 / cal.batch_size  # a pass timed on a batch, per example it holds
    rec = method_record(cost.method)
    if rec.members:  # its members one after another (circuitstat.circuits.plan._ensemble_cost)
        members = sum(estimate_seconds(cal, model, method_cost(model.cfg, m, n=n, positions=positions or 1, level=level,
                                                               batch_size=cost.batch_size, ig_steps=ig_steps,
                                                               max_rows=cost.max_rows),
                                       n=n, level=level, ig_steps=ig_steps, positions=positions) for m in rec.members)
        return members - 4 * n * per_example * cal.forward_s  # the forwards the members share (plan._ensemble_cost)
    if rec.family == "mask":  # per fit: its forwards, then per step and draw a masked run and its backward
        runs = cost.backwards // max(n, 1)  # over every fit
        fits = max(1, cost.forwards // max(n, 1) - runs) // rec.passes.forwards
        if cal.mask_step_s <= 0:
            raise ValueError("pricing a mask fit needs a calibration with its masked step (calibrate(mask=True))")
        return n * per_example * (rec.passes.forwards * fits * cal.forward_s + runs * cal.mask_step_s)
    if rec.passes.suffix:
        return _exact_seconds(cal, model, cost, n=n, level=level)
    return _gradient_seconds(cal, model, rec.name, n, ig_steps, positions)


def _gradient_seconds(cal: Calibration, model, method: str, n: int, ig_steps: int, positions: int | None) -> float:
    """A gradient method's time: its plain forwards and gradient runs (timed with a sender intervention for IG's
    interpolated runs), its backwards beyond one per run (AtP*'s GradDrop: a gradient run less a forward each),
    a contraction per contraction it makes, and AtP*'s QK fix priced at the contraction's FLOP rate."""
    cfg, g = model.cfg, model.graph
    per_example = 1.0 / cal.batch_size
    passes = method_record(method).passes
    k = pass_counts(cfg, method, ig_steps)  # post-norm models contract every gradient run (circuitstat.circuits.plan)
    run_s = cal.ig_gradient_s if passes.intervened else cal.gradient_s
    contraction = cal.contraction_s * per_example
    backward_s = max(cal.gradient_s - cal.forward_s, 0.0)
    total = (per_example * (k["forwards"] * cal.forward_s + k["runs"] * run_s + (k["backwards"] - k["runs"]) * backward_s)
             + k["contractions"] * contraction)
    if passes.qk_fix:
        if positions is None:
            raise ValueError("pricing the QK fix needs the prompts' length (positions)")
        total += contraction * qk_fix_flops(cfg, g, positions, k["backwards"]) / contraction_flops(g, cfg, positions)
    return n * total


def _exact_seconds(cal: Calibration, model, cost: Cost, *, n: int, level: str) -> float:
    """Exact patching's time: its two forwards, then every receiver's suffix calls (rows of a batch, max_rows at a time)."""
    g = model.graph
    batches = [min(cost.batch_size, n - s) for s in range(0, n, cost.batch_size)]
    total = 2 * n * (1.0 / cal.batch_size) * cal.forward_s
    for b in batches:
        if level == "edge":
            for r in range(g.n_receivers):
                rows, layer = b * int(g.n_upstream[r]), int(g.receiver_layer[r])
                calls = math.ceil(rows / cost.max_rows)
                total += sum(cal.suffix_call(layer, min(cost.max_rows, rows - k * cost.max_rows))
                             for k in range(calls))
        else:
            total += sum(cal.suffix_call(max(0, int(g.sender_layer[u])), b) for u in range(g.n_senders))
    return total


def plan_costs(model, data, *, level: str = "edge", batch_size: int = BATCH_SIZE.default,
               ig_steps: int = IG_STEPS.default, budget: int | None = None, methods=None) -> dict[str, Cost]:
    """{method: its Cost on ``data``}, batch size and exact's rows fitted to ``budget`` bytes when given; a method
    that cannot fit the budget even with one example (and one suffix row) is priced at that minimum, its memory
    over the budget (:func:`fit_mark` marks it: a plan prices what it cannot run here, for a larger machine).
    ``methods`` default: every method the model can run (one defined on additive writes only is left out on a
    post-norm model, which attribute refuses)."""
    from circuitstat.core.errors import InputError

    cfg = model.cfg
    if methods is None:
        methods = methods_for(cfg)
    n, P = int(data.clean.shape[0]), int(data.clean.shape[1])
    itemsize = model.dtype.itemsize
    costs: dict[str, Cost] = {}
    for method in methods:
        b, rows = batch_size, 256
        if budget is not None:
            widest = batch_size * int(model.graph.n_upstream.max())
            try:
                b, rows = fit_memory(cfg, method, budget, positions=P, level=level, batch_size=batch_size,
                                     max_rows=widest, itemsize=itemsize)
            except InputError:  # not even one example fits: the smallest run, marked as over the budget
                b, rows = 1, 1
        costs[method] = method_cost(cfg, method, n=n, positions=P, level=level, batch_size=b, ig_steps=ig_steps,
                                    max_rows=rows, itemsize=itemsize)
    return costs


def plan_lines(model, data, *, level: str = "edge", batch_size: int = BATCH_SIZE.default,
               ig_steps: int = IG_STEPS.default, budget: int | None = None, n_jobs: int = N_JOBS.default,
               timing_model=None, untimed: str = "",
               device: str = "cpu", rate: tuple[float, str] | None = None, verify=None,
               verify_method: str = "eap", pruning: tuple[int, ...] | None = None,
               limits: Limits | None = None, header: tuple[str, ...] = (),
               verify_share: float | None = None) -> list[str]:
    """The plan as printed lines: a header, the calibration, one row per method, a legend (and, with ``verify``
    (a VerifySpec), the verified run's two phases: ``verify_method`` on all N, exact on n of them).

    ``model`` may be a skeleton on the meta device (circuitstat.circuits.skeleton): the counts need only shapes.
    The time estimate is calibrated on ``timing_model`` (default ``model`` unless it is on the meta
    device); without one, ``untimed`` says why and the time is the FLOPs at ``rate`` (TFLOP/s, source;
    default :func:`flop_rate` of ``device`` and the model's dtype), a lower bound. ``pruning`` (steps, fits[, draws])
    adds the mask method's row (``verify_method``: edge-pruning or ugs): that many fits of that many steps, ``draws``
    masks per prompt and step for UGS (circuitstat.circuits.plan.pruning_cost), timed by a calibrated masked step. ``limits``
    (default: :func:`run_limits` of ``budget``) marks each row that does not fit (:func:`fit_mark`); ``header``:
    lines printed after the first (the model's parameters); ``verify_share``: add the largest verified run of each
    design within that share of exact (:func:`verify_share_lines`).
    """
    limits = limits or run_limits(budget, allow_large=False, device=device)
    n, P = int(data.clean.shape[0]), int(data.clean.shape[1])
    costs = plan_costs(model, data, level=level, batch_size=batch_size, ig_steps=ig_steps, budget=budget)
    if pruning is not None:
        from circuitstat.circuits.plan import pruning_cost

        from circuitstat.circuits.methods import MASK_METHODS

        name = verify_method if verify_method in MASK_METHODS else MASK_METHODS[0]  # edge-pruning unless a mask method
        steps, fits, draws = (*pruning, 1)[:3]
        costs[name] = pruning_cost(model.cfg, n=n, positions=P, steps=steps, fits=fits, batch_size=batch_size,
                                   itemsize=model.dtype.itemsize, method=name, draws=draws)
    fitted = [c.batch_size for c in costs.values()]
    if timing_model is None and model.device.type != "meta":
        timing_model = model
    if timing_model is None:
        rate = rate or flop_rate(device, model.dtype)
        how = (f"no time estimate: {untimed or 'no model to time'} (counts from shapes only, no weights); est. time "
               f"= FLOPs at {rate[0]:.3g} TFLOP/s ({rate[1]}), a lower bound")
        def seconds(c):
            return c.flops / (rate[0] * 1e12), ">= "

        lines = _cost_table(model, costs, n, P, level, ig_steps, budget, n_jobs,
                            f", {str(model.dtype).replace('torch.', '')}", [*header, how], seconds, limits)
        time_is = "FLOPs at the rate above"
    else:  # the calibration itself stays within the budget
        cal = calibrate(timing_model, data, min(fitted, default=1), mask=pruning is not None)
        how = (f"calibration on {cal.batch_size} examples, one thread, {cal.clock}: forward {cal.forward_s * 1e3:.3g} ms, "
               f"gradient run {cal.gradient_s * 1e3:.3g} ms, suffix row from layer 0 {cal.suffix_s[0][1] * 1e3:.3g} ms"
               + (f", masked step {cal.mask_step_s * 1e3:.3g} ms" if cal.mask_step_s else ""))
        def seconds(c):
            if c.method == "exact-verify":
                return _verify_seconds(cal, model, c, positions=P), ""
            return estimate_seconds(cal, model, c, n=n, level=level, ig_steps=ig_steps, positions=P), ""

        lines = _cost_table(model, costs, n, P, level, ig_steps, budget, n_jobs, "",
                            [*header, how, calibration_cost_line(cal)], seconds, limits)
        time_is = (f"{cal.clock} of one thread per worker, calibrated on this machine" + (
            "; on a busy machine a run's wall time is longer" if cal.clock == "CPU time" else ""))
    from .plan_verify import verify_lines, verify_share_lines

    if verify is not None:
        lines += verify_lines(model, costs, verify, verify_method, n=n, P=P, batch_size=batch_size, seconds=seconds)
    if verify_share is not None:  # --verify-share: the largest verified run of each design within that share
        lines += verify_share_lines(model, costs, verify_method, verify_share, n=n, P=P)
    return lines + [limits_line(limits), "forwards: full forwards (counterfactual, clean, gradient runs); suffix rows: exact patching's "
                    f"(example, sender) suffix forwards; memory: estimated peak per worker and device, incl. a whole copy of "
                    f"the weights (a model is never split across devices); time: {time_is}"]


def calibration_cost_line(cal: Calibration) -> str:
    """What the calibration cost and the load it ran under, as a printed line."""
    load = "no load average on this platform" if cal.load is None else f"load average {cal.load:.1f}"
    busy = cal.wall_s / cal.cpu_s if cal.cpu_s > 0 else float("nan")
    return (f"calibration cost: {cal.passes} model passes, {cal.cpu_s:.3g} s CPU, {cal.wall_s:.3g} s wall "
            f"({load} on {cal.cores} core{'s' if cal.cores > 1 else ''}; wall / CPU {busy:.2g})")


def _verify_seconds(cal: Calibration, model, cost: Cost, *, positions: int) -> float:
    """Phase 2's time: exact's suffix rows for the verified prompts (the share of edges verified) and the
    forwards of the whole batches holding them (``cost.forwards`` / 2 examples)."""
    n = cost.suffix_rows // max(cost.columns, 1)  # the verified prompts
    exact_n = method_cost(model.cfg, "exact", n=n, positions=positions, batch_size=cost.batch_size,
                          max_rows=cost.max_rows)
    full = estimate_seconds(cal, model, exact_n, n=n, positions=positions)
    forwards = 2 * n * cal.forward_s / cal.batch_size
    share = cost.columns / model.graph.n_edges
    return (full - forwards) * share + cost.forwards * cal.forward_s / cal.batch_size


def _cost_table(model, costs: dict, n: int, P: int, level: str, ig_steps: int, budget, n_jobs: int, dtype: str,
                how: list[str], seconds, limits: Limits) -> list[str]:
    """The plan's header, ``how`` the time is estimated, and one row per method; ``seconds(cost)`` gives the
    one-worker time and its prefix (">= " for a lower bound), divided over the workers its chunks can use;
    ``fits`` marks the rows over ``limits``."""
    from circuitstat.circuits.limits import format_bytes

    unit = "edges" if level == "edge" else "nodes"
    cols = model.graph.n_edges if level == "edge" else model.graph.n_senders
    w = max(19, *(len(c.method) for c in costs.values()))  # the method column fits its longest name
    lines = [f"plan: {n} examples x {P} positions, {cols:,} {unit}, ig steps {ig_steps}, "
             f"{n_jobs} worker{'s' if n_jobs > 1 else ''}{dtype}"
             + ("" if budget is None else f", --max-memory {format_bytes(budget)}"), *how,
             f"{'method':<{w}} {unit:>9} {'forwards':>9} {'backwards':>9} {'suffix rows':>12} {'FLOPs':>9} "
             f"{'memory':>10} {'batch':>5} {'fits':>12} {'est. time':>10}"]
    for c in costs.values():
        one, prefix = seconds(c)
        est = one / min(n_jobs, -(-n // c.batch_size))
        lines.append(f"{c.method:<{w}} {c.columns:>9,} {c.forwards:>9,} {c.backwards:>9,} {c.suffix_rows:>12,} "
                     f"{c.flops:>9.3g} {format_bytes(c.memory_peak):>10} {c.batch_size:>5} "
                     f"{fit_mark(c, limits):>12} {prefix + duration(est):>10}")
    return lines
