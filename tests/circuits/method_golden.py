"""The configs, calibration and grid of tests/circuits/test_method_registry.py's golden plan numbers, and the
function that computes them (run as a script before the registry refactor to write the fixture it checks)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "method_plan_golden.json"
CONFIGS = {  # additive writes (1 and 2 layers, gated MLP, attention-only) and a post-norm model (one contraction per run)
    "tiny": dict(n_layers=1, n_heads=1, d_model=4, d_head=2, d_mlp=8, vocab_size=10, n_ctx=16),
    "two-layer-gated": dict(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=64, vocab_size=97, n_ctx=64,
                            mlp="gated", norm="rmsnorm", positional="rotary"),
    "attn-only": dict(n_layers=3, n_heads=2, d_model=16, d_head=8, d_mlp=8, vocab_size=50, n_ctx=32, mlp="none"),
    "post-norm": dict(n_layers=2, n_heads=2, d_model=16, d_head=8, d_mlp=32, vocab_size=50, n_ctx=32,
                      post_norm=True, norm="rmsnorm"),
}
GRID = [(n, P, batch, steps, rows) for n, P, batch, steps, rows in
        [(1, 3, 16, 5, 256), (5, 7, 2, 3, 4), (7, 12, 3, 1, 1)]]
CALIBRATION = dict(batch_size=3, forward_s=0.0123, gradient_s=0.0417, ig_gradient_s=0.0451,
                   suffix_s=None, patch_call_s=0.0007, contraction_s=0.0031, mask_step_s=0.0779)
PRUNING = [(4, 2, 1), (3, 1, 3)]  # (steps, fits, draws)


def config(name: str):
    """The ModelConfig called ``name``."""
    from circuitstat.circuits.model import ModelConfig

    return ModelConfig(**CONFIGS[name])


def calibration(cfg):
    """A fixed Calibration (made-up seconds: pricing is arithmetic on them, nothing is timed)."""
    from circuitstat.pipelines.plan import Calibration

    L = cfg.n_layers
    suffix = tuple((0.001 * (L - l) + 0.0005, 0.0002 * (L - l) + 0.0001) for l in range(L))
    return Calibration(**{**CALIBRATION, "suffix_s": suffix})


def compute(methods, mask_methods) -> dict:
    """{key: [forwards, backwards, suffix_rows, flops, layer_passes, memory_peak, columns, seconds]} over the grid."""
    from circuitstat.circuits.plan import graph_of, method_cost, pruning_cost
    from circuitstat.pipelines.plan import estimate_seconds

    out = {}
    for name in CONFIGS:
        cfg = config(name)
        model = SimpleNamespace(cfg=cfg, graph=graph_of(cfg))
        cal = calibration(cfg)
        for method in methods:
            for level in ("edge", "node"):
                for n, P, batch, steps, rows in GRID:
                    try:
                        c = method_cost(cfg, method, n=n, positions=P, level=level, batch_size=batch, ig_steps=steps,
                                        max_rows=rows)
                    except Exception as e:  # noqa: BLE001 - a refusal is recorded as what it says
                        out[f"{name}|{method}|{level}|{n}|{P}|{batch}|{steps}|{rows}"] = type(e).__name__
                        continue
                    try:
                        s = estimate_seconds(cal, model, c, n=n, level=level, ig_steps=steps, positions=P)
                    except KeyError as e:  # before the registry: exact on a post-norm model (a bug, now fixed)
                        s = type(e).__name__
                    out[f"{name}|{method}|{level}|{n}|{P}|{batch}|{steps}|{rows}"] = [
                        c.forwards, c.backwards, c.suffix_rows, c.flops, c.layer_passes, c.memory_peak, c.columns, s]
        for method in mask_methods:
            for steps, fits, draws in PRUNING:
                for n, P, batch, _, _ in GRID:
                    c = pruning_cost(cfg, n=n, positions=P, steps=steps, fits=fits, batch_size=batch, method=method,
                                     draws=draws)
                    s = estimate_seconds(cal, model, c, n=n, positions=P)
                    out[f"{name}|{method}|mask|{n}|{P}|{batch}|{steps}|{fits}|{draws}"] = [
                        c.forwards, c.backwards, c.optimizer_steps, c.flops, c.layer_passes, c.memory_peak,
                        c.columns, s]
    return out


if __name__ == "__main__":  # writes the fixture from the code as it is now
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from circuitstat.circuits.plan import METHODS

    FIXTURE.write_text(json.dumps(compute(METHODS, ("edge-pruning", "ugs")), indent=0, sort_keys=True) + "\n")
    print(FIXTURE, len(json.loads(FIXTURE.read_text())))
