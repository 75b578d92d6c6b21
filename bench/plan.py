"""The cost plan against the measured run: time and memory ratios of `circuitstat attribute --plan`.

For each bench model and method: the plan's estimated time (circuitstat.pipelines.plan: calibration on the
model, priced by the method's passes) against the measured single-threaded attribute() time, and
the plan's estimated activation memory (its peak less the weights) against the measured growth of
the process's resident memory during the run (sampled from /proc/self/statm every millisecond,
with glibc told to return large freed blocks at once).
Both sides take the fastest of ``--repeats`` rounds. Ratios are estimate / measured (1 = exact,
the plan's promise is within 2x).

    python bench/plan.py [--repeats 2] [--n 16] [--batch-size 8] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from circuitstat.circuits import load_model
from circuitstat.circuits.attribution import attribute
from circuitstat.circuits.plan import method_cost, weight_bytes
from circuitstat.pipelines.build import build_task
from circuitstat.pipelines.parallel import single_threaded
from circuitstat.pipelines.plan import calibrate, estimate_seconds

# the exact-patching family (4 heads, d_model 128) at two depths; and the GPT-2-small shape
FAMILY = "random:gpt2?n_layer={L}&n_head=4&n_embd=128&vocab_size=512&n_positions=128&seed=0"
GPT2_SMALL = "random:gpt2?n_layer=12&n_head=12&n_embd=768&vocab_size=50257&seed=0"
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(fn) -> tuple[float, int]:
    """(seconds, peak growth of resident memory in bytes) of fn()."""
    base, peak, stop = _rss(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    stop.set()
    th.join()
    return dt, max(peak[0], _rss()) - base


def main() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc otherwise keeps freed blocks (its mmap threshold grows with use), so a later run's growth
        # would hide in memory an earlier one freed; a fixed threshold returns large blocks at once
        os.environ.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
        os.execv(sys.executable, [sys.executable, *sys.argv])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="only the 2-layer model, no GPT-2-small shape")
    args = ap.parse_args()
    cases = [(FAMILY.format(L=2), ("exact", "eap", "eap-ig-inputs", "eap-ig-activations", "clean-corrupted"))]
    if not args.quick:
        cases += [(FAMILY.format(L=6), ("exact", "eap", "eap-ig-inputs", "clean-corrupted")),
                  (GPT2_SMALL, ("eap", "clean-corrupted", "eap-ig-inputs"))]
    print(f"{args.n} induction examples, batch {args.batch_size}, one thread; fastest of {args.repeats} rounds; "
          "ratio = plan estimate / measured")
    print(f"{'model':<34} {'method':<19} {'est. s':>8} {'meas. s':>8} {'ratio':>6}   "
          f"{'est. act.':>10} {'meas. act.':>10} {'ratio':>6}")
    for source, methods in cases:
        model = load_model(source)
        task = build_task(model, "induction", n=args.n, seed=0)
        P = int(task.clean.shape[1])
        cals = [calibrate(model, task, args.batch_size) for _ in range(args.repeats)]
        short = source.split("?")[0] + "?" + "&".join(p for p in source.split("?")[1].split("&")
                                                      if p.split("=")[0] in ("n_layer", "n_embd"))
        for method in methods:
            cost = method_cost(model.cfg, method, n=args.n, positions=P, batch_size=args.batch_size)
            est = min(estimate_seconds(c, model, cost, n=args.n) for c in cals)
            runs = []
            for _ in range(args.repeats):
                with single_threaded():
                    runs.append(measure(lambda: attribute(model, task, method, batch_size=args.batch_size,
                                                          progress=False)))
            secs, grown = min(r[0] for r in runs), max(r[1] for r in runs)
            act = cost.memory_peak - weight_bytes(model.cfg, model.dtype.itemsize)
            mem_ratio = f"{act / grown:6.2f}" if grown > 0 else "     -"
            print(f"{short:<34} {method:<19} {est:8.3g} {secs:8.3g} {est / secs:6.2f}   "
                  f"{act / 2**20:8.1f}Mi {grown / 2**20:8.1f}Mi {mem_ratio}", flush=True)


if __name__ == "__main__":
    main()
