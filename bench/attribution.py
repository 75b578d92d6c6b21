"""Attribution benchmarks: ratios against references measured in the same run (not a test).

1. EAP over all edges of a GPT-2-small-sized random model, batch 8 x 16 tokens, as a multiple of
   one clean forward on the same batch (floor about 3: two forwards and one backward).
2. Exact per-example edge effects on random GPT-2 models (4 heads, d_model 128) of 2, 6 and 12
   layers: batched suffix recomputation against the definition, one full forward per edge with
   only that edge patched (timed on a random subset of edges and scaled per edge).
3. Peak resident memory of EAP for N = 1000 examples against one batch's worth plus the score matrix.
4. With ``--reference`` (and TransformerLens installed: ``pip install -c constraints.txt -e ".[reference]"``):
   bench/reference_eap.py, EAP against the EAP-IG reference algorithm on TransformerLens hooks,
   edge for edge, in-process and as whole processes (about 45 min on 2 cores, hence opt-in).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import torch

torch.set_num_threads(int(__import__("os").environ.get("BENCH_THREADS", "2")))


def _best(fn, repeat=3):
    """Least CPU time of this process over ``repeat`` calls after one warm-up (the machine is shared:
    wall time would count the other processes' load)."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


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
    with torch.no_grad():
        t_ours = _best(lambda: model(ids))
        t_hf = _best(lambda: hf(ids).logits)
    t_eap = _best(lambda: attribute(model, task, "eap", batch_size=8, progress=False), repeat=2)
    return {"edges": model.graph.n_edges, "clean_forward_s": t_ours, "hf_forward_s": t_hf, "eap_s": t_eap,
            "eap_over_forward": t_eap / t_ours, "eap_over_hf_forward": t_eap / t_hf}


EXACT_DEPTHS = (2, 6, 12)


def exact_flop_ceiling(cfg, P: int) -> float:
    """Multiply-adds of one full forward per edge over those of the batched suffixes (same rows).

    A receiver in layer l needs its own layer (one head, or the MLP, plus the MLP after a patched
    head), every later layer at all positions, and the last layer's keys/values at all positions
    but its query and MLP at the read-out only; the reference runs all L layers at all positions.
    Whatever the implementation, the engine cannot beat this ratio by more than its per-row
    efficiency: the suffix after layer l is nonlinear in the patched residual and must be run
    for every (example, edge) pair.
    """
    L, H, D, E, F = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp
    mlp = 2 * D * F if cfg.has_mlp else 0
    attn_pos = 4 * D * H * E + 2 * P * H * E
    full = P * (attn_pos + mlp)
    last = P * 2 * D * H * E + 2 * D * H * E + 2 * P * H * E + mlp
    head = D * E + 2 * P * E + E * D

    def suffix(layer: int) -> float:
        return (L - layer - 2) * full + last if layer < L - 1 else 0

    ours = ref = 0.0
    g = __import__("circuitstat.circuits.graph", fromlist=["ComponentGraph"]).ComponentGraph(L, H, cfg.has_mlp, cfg.parallel)
    for layer in range(L):
        U = g.upstream_of_attention(layer)
        after_head = 0 if cfg.parallel else mlp
        if layer < L - 1:
            ours += 3 * H * U * (P * (head + after_head) + suffix(layer))
            ours += (g.upstream_of_mlp(layer) * (P * mlp + suffix(layer))) if cfg.has_mlp else 0
        else:
            ours += H * U * (head + mlp) + 2 * H * U * (P * D * E + head + mlp) + g.upstream_of_mlp(layer) * mlp
    ref = g.n_edges * L * full
    return ref / ours


def bench_exact(n_layers: int, ref_edges: int = 300, seed: int = 0, corrupt: str = "all") -> dict:
    """Exact edge effects on a random GPT-2 (4 heads, d_model 128, 16 induction prompts of 19
    tokens) against one full forward per edge; the reference loop runs on a random subset of at
    most ``ref_edges`` edges and its time is scaled per edge to all edges."""
    import numpy as np

    from circuitstat.circuits import Intervention, load_model
    from circuitstat.circuits.ablation import last_index
    from circuitstat.circuits.attribution import attribute
    from circuitstat.circuits.tasks import make_task

    model = load_model(f"random:gpt2?n_layer={n_layers}&n_head=4&n_embd=128&vocab_size=512&n_positions=64&seed=0")
    task = make_task("induction", vocab_size=512, n=16, seed=0, seq_len=10, corrupt=corrupt)
    g = model.graph
    # CPU time of this process, not wall time: the bench machine is shared
    t = time.process_time()
    ours = torch.as_tensor(attribute(model, task, "exact", batch_size=16, progress=False).scores)
    t_ours = time.process_time() - t

    rng = np.random.default_rng(seed)
    subset = np.sort(rng.choice(g.n_edges, size=min(ref_edges, g.n_edges), replace=False))
    idx = torch.arange(task.clean.shape[0])
    last = last_index(task.attention_mask)
    with torch.no_grad():
        cf = model.run(task.corrupted, task.attention_mask, keep_senders=True).senders
        base = model.run(task.clean, task.attention_mask, logits_at=last).logits
        m0 = task.score(base, indices=idx, clean_logits=base)
        ref = torch.zeros(len(idx), len(subset))
        t = time.process_time()
        for j, e in enumerate(subset):
            mask = torch.zeros(g.n_edges)
            mask[e] = 1
            lo = model.run(task.clean, task.attention_mask, intervention=Intervention.edges(mask, cf), logits_at=last).logits
            ref[:, j] = task.score(lo, indices=idx, clean_logits=base) - m0
        t_ref = (time.process_time() - t) * g.n_edges / len(subset)
    return {"layers": n_layers, "corrupt": corrupt, "flop_ceiling": exact_flop_ceiling(model.cfg, task.clean.shape[1]), "edges": g.n_edges, "ref_edges": len(subset), "examples": 16, "exact_s": t_ours,
            "loop_s": t_ref, "speedup": t_ref / t_ours, "max_abs_diff": float((ref - ours[:, subset]).abs().max())}


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
    if sys.argv[1:] == ["--exact"]:
        for depth in EXACT_DEPTHS:
            print(bench_exact(depth))
        print(bench_exact(6, corrupt="answer"))
        sys.exit(0)
    e = bench_eap()
    print(f"EAP, GPT-2-small shape ({e['edges']} edges), batch 8x16: {e['eap_s']:.3f} s = "
          f"{e['eap_over_forward']:.2f} x one clean CircuitModel forward ({e['clean_forward_s']:.3f} s), "
          f"{e['eap_over_hf_forward']:.2f} x one HF forward ({e['hf_forward_s']:.3f} s)   [floor ~3, aim <= 3.5]")
    for depth, corrupt in [(d, "all") for d in EXACT_DEPTHS] + [(6, "answer")]:
        x = bench_exact(depth, corrupt=corrupt)
        scaled = "" if x["ref_edges"] == x["edges"] else f"; loop timed on {x['ref_edges']} random edges, scaled per edge"
        print(f"exact, {depth}-layer model ({x['edges']} edges, {x['examples']} examples, corrupt={corrupt}): "
              f"{x['exact_s']:.2f} s vs {x['loop_s']:.2f} s CPU for one full forward per edge{scaled} = "
              f"{x['speedup']:.1f}x faster (max |diff| {x['max_abs_diff']:.1e}); flop ratio of the two "
              f"{x['flop_ceiling']:.1f}x (the loop also pays edge-mask overhead)   [aim >= 10x]")
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
