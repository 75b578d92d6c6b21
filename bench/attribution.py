"""Attribution benchmarks: ratios against references measured in the same run (not a test).

One torch thread (threads are bench/threads.py's subject), CPU time of the process, each side timed
``--repeats`` times, interleaved, with its spread (min / median / max) printed; a ratio is the ratio of
medians with the range the extremes allow. A ratio that physics rules out is printed as a MEASUREMENT
ERROR, not as a result: EAP below one clean forward (it contains one), or exact patching faster than
the loop by more than 1.5x its FLOP ratio (both sides run the same kind of matrix products on one thread).

1. EAP over all edges of a GPT-2-small-sized random model, batch 8 x 16 tokens, as a multiple of
   one clean forward on the same batch (floor about 3: two forwards and one backward).
2. Exact per-example edge effects on random GPT-2 models (4 heads, d_model 128) of 2 and 6 layers
   (12 with ``--deep``): batched suffix recomputation against the loop a user would write, one full
   forward per edge adding that edge's Δz to its receiver's input (``Intervention.at_receiver``, no
   edge mask over the whole graph), timed on a random subset of edges and scaled per edge.
3. Peak resident memory of EAP for N = 1000 examples against one batch's worth plus the score matrix.
4. With ``--reference`` (and TransformerLens installed: ``pip install -c constraints.txt -e ".[reference]"``):
   bench/reference_eap.py, EAP against the EAP-IG reference algorithm on TransformerLens hooks,
   edge for edge, in-process and as whole processes (about 45 min on 2 cores, hence opt-in).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)
REPEATS = 5
EXACT_BOUND_SLACK = 1.5  # exact may beat the loop's FLOP ratio by per-FLOP efficiency, not by more than this


def _interleaved(fns: dict, repeats: int) -> dict:
    """{name: [CPU seconds of each call]} over ``repeats`` rounds, every fn once per round (after one warm-up
    round), so load that comes and goes touches every side alike. CPU time: wall time would count the
    other processes on a shared machine."""
    times = {k: [] for k in fns}
    for r in range(repeats + 1):
        for k, fn in fns.items():
            t = time.process_time()
            fn()
            if r:
                times[k].append(time.process_time() - t)
    return times


def spread(xs: list) -> str:
    """min / median / max of ``xs`` seconds."""
    return f"{min(xs):.3g} / {statistics.median(xs):.3g} / {max(xs):.3g} s"


def ratio(num: list, den: list) -> tuple[float, float, float]:
    """(median ratio, lowest, highest ratio the two spreads allow)."""
    return statistics.median(num) / statistics.median(den), min(num) / max(den), max(num) / min(den)


def bench_eap() -> dict:
    from circuitstat.circuits import load_hf
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.convert import from_hf
    from circuitstat.circuits.tasks import make_task

    hf = load_hf("random:gpt2?n_layer=12&n_head=12&n_embd=768&vocab_size=50257&seed=0")
    model = from_hf(hf)
    task = make_task("induction", vocab_size=50257, n=8, seed=0, seq_len=7)  # 1 + 7 + 6 = 14 tokens
    ids = torch.randint(0, 50257, (8, 16))
    task = task.__class__(name="bench", clean=ids, corrupted=torch.randint(0, 50257, (8, 16)),
                          attention_mask=torch.ones(8, 16, dtype=torch.long), answer=ids[:, 0], wrong_answer=ids[:, 1])
    def forward():
        with torch.no_grad():
            model(ids)

    def hf_forward():
        with torch.no_grad():
            hf(ids).logits

    t = _interleaved({"forward": forward, "hf": hf_forward,
                      "eap": lambda: attribute(model, task, "eap", batch_size=8, progress=False)}, REPEATS)
    return {"edges": model.graph.n_edges, "times": t, "eap_over_forward": ratio(t["eap"], t["forward"]),
            "eap_over_hf_forward": ratio(t["eap"], t["hf"])}


EXACT_DEPTHS = (2, 6, 12)


def user_loop(model, task, edges):
    """[N, len(edges)] effects by the loop a user would write: per edge (u -> v), one forward of the batch
    adding Δz_u = z_u(corrupted) - z_u(clean) to v's input (Intervention.at_receiver), read at the last token."""
    from circuitstat.circuits import Intervention
    from circuitstat.circuits.ablation import last_index

    g, idx = model.graph, torch.arange(task.clean.shape[0])
    last = last_index(task.attention_mask)
    with torch.no_grad():
        cf = model.run(task.corrupted, task.attention_mask, keep_senders=True, compute_logits=False).senders
        clean = model.run(task.clean, task.attention_mask, keep_senders=True, logits_at=last)
        m0 = task.score(clean.logits, indices=idx, clean_logits=clean.logits)
        delta = cf - clean.senders
        out = torch.zeros(len(idx), len(edges))
        for j, e in enumerate(edges):
            u, v = int(g.edge_sender[e]), int(g.edge_receiver[e])
            lo = model.run(task.clean, task.attention_mask, intervention=Intervention.at_receiver(v, delta[:, u]),
                           logits_at=last).logits
            out[:, j] = task.score(lo, indices=idx, clean_logits=clean.logits) - m0
    return out


def bench_exact(n_layers: int, ref_edges: int = 100, seed: int = 0, corrupt: str = "all",
                repeats: int = 3) -> dict:
    """Exact edge effects on a random GPT-2 (4 heads, d_model 128, 16 induction prompts of 19
    tokens) against the user's loop (:func:`user_loop`) on a random subset of at most ``ref_edges`` edges,
    its time scaled per edge to all edges; the FLOP ratio of the two counted by FlopCounterMode as they run
    (exact's engine skips rows and the clean prefix where the data allow: circuitstat.circuits.plan's count is an upper
    bound there, so the ratio uses the FLOPs actually run)."""
    import numpy as np
    from torch.utils.flop_counter import FlopCounterMode

    from circuitstat.circuits import load_model
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.tasks import make_task

    model = load_model(f"random:gpt2?n_layer={n_layers}&n_head=4&n_embd=128&vocab_size=512&n_positions=64&seed=0")
    task = make_task("induction", vocab_size=512, n=16, seed=0, seq_len=10, corrupt=corrupt)
    g = model.graph
    rng = np.random.default_rng(seed)
    subset = np.sort(rng.choice(g.n_edges, size=min(ref_edges, g.n_edges), replace=False))
    res = {}
    t = _interleaved({"exact": lambda: res.__setitem__("exact", attribute(model, task, "exact", batch_size=16,
                                                                             progress=False).scores),
                      "loop": lambda: res.__setitem__("loop", user_loop(model, task, subset))}, repeats)
    scale = g.n_edges / len(subset)
    t["loop"] = [x * scale for x in t["loop"]]
    with FlopCounterMode(display=False) as fc:
        user_loop(model, task, subset[:1])
    one_edge = fc.get_total_flops()  # + the two setup forwards, which the loop pays once
    with FlopCounterMode(display=False) as fc0:
        user_loop(model, task, subset[:0])
    loop_flops = fc0.get_total_flops() + (one_edge - fc0.get_total_flops()) * g.n_edges
    with FlopCounterMode(display=False) as fc:
        attribute(model, task, "exact", batch_size=16, progress=False)
    exact_flops = fc.get_total_flops()
    diff = float((res["loop"] - torch.as_tensor(res["exact"])[:, subset]).abs().max())
    return {"layers": n_layers, "corrupt": corrupt, "edges": g.n_edges, "ref_edges": len(subset), "examples": 16,
            "times": t, "speedup": ratio(t["loop"], t["exact"]), "flop_ratio": loop_flops / exact_flops,
            "max_abs_diff": diff}


def _memory_child(n: int) -> None:
    from circuitstat.circuits import load_model
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.tasks import make_task

    model = load_model("random:gpt2?n_layer=4&n_head=8&n_embd=256&vocab_size=2048&n_positions=64&seed=0")
    task = make_task("induction", vocab_size=2048, n=n, seed=0, seq_len=10)
    _reset_peak_rss()
    sm = attribute(model, task, "eap", batch_size=16, progress=False)
    print(json.dumps({"n": n, "edges": sm.scores.shape[1], "score_matrix_mb": sm.scores.nbytes / 2**20,
                      "peak_rss_mb": _peak_rss_kib() / 1024}))


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (Linux): ru_maxrss survives fork + exec, so a child started
    by a parent holding GPT-2-small would otherwise report the parent's peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_kib() -> int:
    """Peak RSS since the last reset (VmHWM), else the process's ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def bench_memory() -> dict:
    rows = {}
    for n in (16, 1000):
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(n)], capture_output=True, text=True, check=True)
        rows[n] = json.loads(out.stdout.strip().splitlines()[-1])
    # Same model and batch size, one batch vs 63 batches: the peak may grow by the score matrix only.
    return {"peak_n16_mb": rows[16]["peak_rss_mb"], "peak_n1000_mb": rows[1000]["peak_rss_mb"],
            "score_matrix_mb": rows[1000]["score_matrix_mb"],
            "excess_mb": rows[1000]["peak_rss_mb"] - rows[16]["peak_rss_mb"] - rows[1000]["score_matrix_mb"]}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--memory-child":
        _memory_child(int(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1:2] == ["--reference"]:
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
        import reference_eap

        reference_eap.main(sys.argv[2:])  # prints the skip line itself without TransformerLens
        sys.exit(0)
    deep = "--deep" in sys.argv[1:]
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, CPU seconds of the process; load average "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs; spreads are min / median / max "
          f"over {REPEATS} (EAP) or 3 (exact) interleaved repeats")
    e = bench_eap()
    r, lo, hi = e["eap_over_forward"]
    verdict = ("MEASUREMENT ERROR: EAP cannot cost less than the clean forward it contains; the timings are "
               "disturbed, rerun on a quieter machine" if lo < 1 else "[floor ~3, aim <= 3.5]")
    print(f"EAP, GPT-2-small shape ({e['edges']} edges), batch 8x16: EAP {spread(e['times']['eap'])}, clean "
          f"CircuitModel forward {spread(e['times']['forward'])}, HF forward {spread(e['times']['hf'])}")
    print(f"  EAP = {r:.2f} x one clean forward (range {lo:.2f}-{hi:.2f}), "
          f"{e['eap_over_hf_forward'][0]:.2f} x one HF forward   {verdict}")
    for depth, corrupt in [(d, "all") for d in EXACT_DEPTHS if deep or d < 12] + [(6, "answer")]:
        x = bench_exact(depth, corrupt=corrupt)
        r, lo, hi = x["speedup"]
        scaled = "" if x["ref_edges"] == x["edges"] else f", loop timed on {x['ref_edges']} random edges and scaled"
        verdict = (f"MEASUREMENT ERROR: beyond {EXACT_BOUND_SLACK}x the FLOP ratio; the timings are disturbed"
                   if lo > EXACT_BOUND_SLACK * x["flop_ratio"] else "[aim >= 10x]")
        print(f"exact, {depth}-layer model ({x['edges']} edges, {x['examples']} examples, corrupt={corrupt}): "
              f"exact {spread(x['times']['exact'])}, user's per-edge loop {spread(x['times']['loop'])}{scaled}")
        print(f"  exact {r:.1f}x faster than the loop (range {lo:.1f}-{hi:.1f}); FLOP ratio loop / exact "
              f"{x['flop_ratio']:.1f}x; max |diff| {x['max_abs_diff']:.1e}   {verdict}")
    import importlib.util

    if importlib.util.find_spec("transformer_lens") is None:
        print("EAP-IG reference comparison skipped: TransformerLens is not installed "
              '(pip install -c constraints.txt -e ".[reference]", then bench/attribution.py --reference)')
    else:
        print("EAP-IG reference comparison: run bench/attribution.py --reference (about 45 min on 2 cores)")
    mem = bench_memory()
    print(f"EAP memory (4-layer model, batch 16): peak RSS {mem['peak_n1000_mb']:.0f} MB for N=1000 vs "
          f"{mem['peak_n16_mb']:.0f} MB for one batch (N=16); score matrix {mem['score_matrix_mb']:.1f} MB; "
          f"excess {mem['excess_mb']:+.0f} MB")
