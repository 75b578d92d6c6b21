"""Every GPU-only check in one command, one table (not a test; no test needs a GPU).

    python bench/gpu.py                    # on a CUDA machine: the whole answer
    python bench/gpu.py --device cpu --dry # the same logic on tiny shapes, on any machine
    python bench/gpu.py --json out.json    # also write the rows as JSON

On a machine without CUDA (and no ``--device cpu``) it says so in one line and exits 0.  Checks:

1. placement: after each method ran, every weight, buffer and every tensor a run keeps (sender outputs,
   residuals, q/k/v, receiver gradients) lies on the device;
2. deterministic mode: with torch's deterministic algorithms on (warn_only=False, so an op without a
   deterministic kernel fails loudly) and CUBLAS_WORKSPACE_CONFIG fixed, two runs of each method give
   bitwise-identical scores;
3. bf16 and fp16 against fp32, per method: max |score difference| relative to the largest fp32 score,
   and the Spearman correlation of the scores (the reduced-precision model, float32 sums);
4. throughput of EAP, EAP-IG (inputs, activations) and exact on a GPT-2-small shape and a Gemma-2-2B
   shape with random weights (bf16): examples/s, and achieved TFLOP/s (circuitstat.circuits.plan's FLOP count over
   the measured time) against the device's peak for the dtype;
5. peak memory (torch.cuda.max_memory_allocated) against the ``--plan`` estimate (circuitstat.circuits.plan).

Shapes: ``gpt2-small`` (12 x 768, 12 heads, vocabulary 50257) and ``gemma-2-2b`` (google/gemma-2-2b's
config: 26 layers, 2304 wide, 8 heads of 256, 4 K/V heads, soft-caps, sandwich norms, windows, tied
256k vocabulary); with ``--dry``, 2-layer versions of both (the same families and features).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises (deterministic cuBLAS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

METHODS_TIMED = ("eap", "eap-ig-inputs", "eap-ig-activations", "exact")
METHODS_DTYPE = ("exact", "eap", "eap-ig-inputs", "eap-ig-activations", "clean-corrupted")


@dataclass
class Row:
    """One line of the table."""

    check: str
    shape: str
    method: str
    dtype: str
    value: str
    reference: str
    ok: str


def peak_tflops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's dense peak for ``dtype`` (None when unknown, e.g. a CPU): circuitstat.pipelines.plan's table."""
    from circuitstat.pipelines.plan import peak_tflops as peak

    return peak(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None


def shape_config(name: str, dry: bool):
    """The ModelConfig of a benchmark shape (circuitstat.circuits.convert from a HF config on the meta device)."""
    import transformers

    from circuitstat.circuits.convert import from_hf

    if name == "gpt2-small":
        c = transformers.GPT2Config(**({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512} if dry else {}))
    else:
        size = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512, sliding_window=4) if dry else
                dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                     num_key_value_heads=4, head_dim=256, vocab_size=256000, sliding_window=4096))
        c = transformers.Gemma2Config(max_position_embeddings=8192, query_pre_attn_scalar=256,
                                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
                                      hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, **size)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(c)
    return from_hf(hf, device="meta").cfg


def random_model(cfg, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A CircuitModel of ``cfg`` with random weights drawn on ``device`` (norms at their neutral scale)."""
    from circuitstat.circuits.model import CircuitModel

    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        m = CircuitModel(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("ln") and leaf.endswith("_w"):
                p.fill_(0.0 if cfg.norm == "rmsnorm_1p" else 1.0)
            elif leaf.startswith("b_") or leaf.endswith("_b"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return m.to(dtype).eval().requires_grad_(False)


def make_task(cfg, n: int, seq_len: int):
    """Induction prompts (repeated random tokens) on the model's vocabulary."""
    from circuitstat.circuits.tasks import make_task as task

    return task("induction", vocab_size=cfg.vocab_size, n=n, seed=0, seq_len=seq_len)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_method(model, task, method: str, batch_size: int, max_rows: int, dtype=None,
               rows=None) -> tuple[np.ndarray, float]:
    """(scores, seconds) of one attribution run (of ``rows`` only, when given)."""
    from circuitstat.circuits.attribution import attribute

    _sync(model.device)
    t0 = time.perf_counter()
    sm = attribute(model, task, method, batch_size=batch_size, max_rows=max_rows, ig_steps=3, progress=False,
                   dtype=dtype, rows=rows)
    _sync(model.device)
    return sm.scores, time.perf_counter() - t0


def placement_row(model, task, shape: str) -> Row:
    """Where the weights and every tensor of a kept and a gradient run live."""
    dev = model.device
    ids, mask = task.clean[:2].to(dev), task.attention_mask[:2].to(dev)
    found = [(n, t.device) for n, t in [*model.named_parameters(), *model.named_buffers()]]
    with torch.no_grad():
        out = model.run(ids, mask, keep_senders=True, keep_resid=True, keep_qkv=True)
    kept = {"senders": out.senders, **{f"resid_pre.{i}": t for i, t in enumerate(out.resid_pre)},
            **{f"qkv.{i}.{j}": t for i, q in enumerate(out.qkv) for j, t in enumerate(q)},
            **{f"attn_pre.{i}": t for i, t in enumerate(out.attn_pre)}, "logits": out.logits}
    with torch.enable_grad():
        g = model.run(ids, mask, receiver_grads="projected", logits_at=mask.sum(-1) - 1)
        grads = model.receiver_input_grads(g, torch.autograd.grad(g.logits.float().sum(), g.grad_inputs))
    kept.update({f"grad.{i}": t for i, t in enumerate(grads)})
    found += [(n, t.device) for n, t in kept.items()]
    wrong = [n for n, d in found if d.type != dev.type]
    return Row("placement", shape, "all", str(model.dtype).replace("torch.", ""),
               f"{len(found) - len(wrong)}/{len(found)} on {dev.type}", "all", "ok" if not wrong else f"off: {wrong[:3]}")


def determinism_rows(model, task, shape: str, batch_size: int, max_rows: int) -> list[Row]:
    """Two runs of each method under deterministic algorithms: bitwise equal, or the op that has none."""
    from circuitstat.pipelines.training.determinism import use_deterministic

    use_deterministic(warn_only=False)
    rows = []
    for method in ("eap", "eap-ig-inputs", "exact"):
        try:
            a, _ = run_method(model, task, method, batch_size, max_rows)
            b, _ = run_method(model, task, method, batch_size, max_rows)
            same = np.array_equal(a, b)
            rows.append(Row("deterministic", shape, method, str(model.dtype).replace("torch.", ""),
                            "bitwise equal" if same else f"max diff {np.abs(a - b).max():.2e}", "bitwise equal",
                            "ok" if same else "FAILED"))
        except RuntimeError as e:  # an op without a deterministic implementation
            rows.append(Row("deterministic", shape, method, "-", str(e).splitlines()[0][:80], "bitwise equal",
                            "FAILED"))
    return rows


def dtype_rows(model, task, shape: str, batch_size: int, max_rows: int) -> list[Row]:
    """bf16 and fp16 scores against fp32 per method (the model cast, float32 accumulation)."""
    from scipy.stats import spearmanr

    rows = []
    for method in METHODS_DTYPE:
        ref, _ = run_method(model, task, method, batch_size, max_rows)
        scale = float(np.abs(ref).max()) or 1.0
        for dtype in (torch.bfloat16, torch.float16):
            got, _ = run_method(model, task, method, batch_size, max_rows, dtype=dtype)
            rel = float(np.abs(got - ref).max()) / scale
            rho = float(spearmanr(got.ravel(), ref.ravel()).statistic) if np.isfinite(got).all() else float("nan")
            rows.append(Row("dtype error", shape, method, str(dtype).replace("torch.", ""),
                            f"max rel {rel:.2e}, spearman {rho:.4f}", "fp32", "ok" if np.isfinite(got).all() else
                            "non-finite"))
    return rows


def throughput_rows(model, task, shape: str, batch_size: int, max_rows: int) -> list[Row]:
    """Examples/s and achieved TFLOP/s per method, and peak memory against the plan's estimate."""
    from circuitstat.circuits.limits import format_bytes
    from circuitstat.circuits.plan import method_cost

    dev, cfg = model.device, model.cfg
    n, P = int(task.clean.shape[0]), int(task.clean.shape[1])
    peak = peak_tflops(dev, model.dtype)
    rows = []
    for method in METHODS_TIMED:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        run_method(model, task, method, batch_size, max_rows, rows=np.arange(1))  # warm-up (kernels, allocator)
        _, seconds = run_method(model, task, method, batch_size, max_rows)
        cost = method_cost(cfg, method, n=n, positions=P, batch_size=batch_size, max_rows=max_rows, ig_steps=3,
                           itemsize=model.dtype.itemsize)
        tflops = cost.flops / seconds / 1e12
        dt = str(model.dtype).replace("torch.", "")
        rows.append(Row("throughput", shape, method, dt, f"{n / seconds:.3g} ex/s, {tflops:.3g} TFLOP/s",
                        f"peak {peak:g} TFLOP/s" if peak else "peak unknown",
                        f"{100 * tflops / peak:.1f}% of peak" if peak else "-"))
        if dev.type == "cuda":
            used = torch.cuda.max_memory_allocated(dev)
            ratio = used / cost.memory_peak
            rows.append(Row("peak memory", shape, method, dt, format_bytes(used), f"plan {format_bytes(cost.memory_peak)}",
                            f"{ratio:.2f}x plan" + ("" if ratio <= 1.0 else " (over the estimate)")))
    return rows


def table(rows: list[Row]) -> str:
    """The rows as one aligned text table."""
    cols = list(Row.__dataclass_fields__)
    data = [cols] + [[str(getattr(r, c)) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in data) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in data)


def main(argv: list[str] | None = None) -> int:
    """Run every check; print the table; return the exit status (0 also when there is no GPU)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (with --dry: the logic on any machine)")
    p.add_argument("--dry", action="store_true", help="tiny shapes, few examples (exercises the logic anywhere)")
    p.add_argument("--n", type=int, default=None, help="examples per method (default 16, dry 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check")
        return 0
    dev = torch.device(a.device)
    n = a.n or (2 if a.dry else 16)
    seq_len, batch_size, max_rows = (3, 2, 64) if a.dry else (8, 8, 4096)
    print(f"device {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{'dry: tiny shapes' if a.dry else 'full shapes'}, {n} examples of {2 * seq_len + 1} tokens", flush=True)
    rows: list[Row] = []
    for shape in ("gpt2-small", "gemma-2-2b"):
        cfg = shape_config(shape, a.dry)
        fp32 = random_model(cfg, dev, torch.float32)
        task = make_task(cfg, n, seq_len)
        rows.append(placement_row(fp32, task, shape))
        # precision (GPT-2 small) and determinism on a few prompts: exact on Gemma-2-2B in float32 is the
        # longest part (74,218 edges, each a suffix through a 256k unembedding)
        small = make_task(cfg, min(n, 4 if shape == "gpt2-small" else 2), seq_len)
        if shape == "gpt2-small":
            rows += dtype_rows(fp32, small, shape, batch_size, max_rows)
        rows += determinism_rows(fp32, small, shape, batch_size, max_rows)
        del fp32
        bf16 = random_model(cfg, dev, torch.bfloat16)
        rows += throughput_rows(bf16, task if shape == "gpt2-small" else make_task(cfg, min(n, 4), seq_len), shape,
                                batch_size, max_rows)
        del bf16
        print(f"{shape}: done", flush=True)
    print(table(rows))
    if a.json is not None:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0 if all(r.ok not in ("FAILED", "non-finite") and not r.ok.startswith("off") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
