"""Planted circuits: an induction circuit written by construction into an otherwise random 2-layer model.

The residual stream has two orthogonal parts.  The *signal* part holds one-hot coordinates (BOS, K
signal tokens, n_ctx positions, K "previous token" and K "output" slots) and a two-head induction
circuit (Olsson et al. 2022) that reads and writes only there:

* ``a0.h0``, the previous-token head: attends from position i to i - 1 (positions in q and k) and
  copies the token there into the previous-token slots;
* ``a1.h0``, the induction head: attends from the current token to the position whose previous token
  equals it (K-composition) and copies that position's token into the output slots.

The *background* part (``d_background`` dimensions) holds random token embeddings and every other head
and both MLPs, with random weights that read and write only the background.  A token id is a pair
(signal token s, background token b), ``id = s * n_background + b``; BOS is the last id.

The unembedding makes the logit of id (s, b) ``signal * onehot(s) + signal_noise * N[s]`` on the output
slots (N: a fixed random K x K matrix, so the signal edges' per-example effects vary with the answer pair)
plus ``background * R[s]`` on the background (R: fixed random vectors).  Logits depend on the signal
token only, and the task's answer and wrong answer (a, a') are exchangeable and independent of the
background tokens, so every background edge's exact (and gradient) score has the form
(R[a] - R[a'])·(something of the background tokens): per-example effects that are not zero, and a
population mean effect that is exactly zero.  Edges between the parts carry nothing their receiver
reads and score exactly zero.  So the true circuit is the four induction edges

    input->a0.h0<v>,  a0.h0->a1.h0<k>,  input->a1.h0<v>,  a1.h0->logits

(the previous-token head's q/k read positions, equal in both prompts; the induction head's query at the
read-out is the same token in both prompts), and every other edge is a null with mean exactly 0.

Knobs: ``signal`` (the circuit's logit gap), ``signal_noise`` (per-example spread of the circuit edges'
effects) and ``background`` (the null edges' spread): difficulty is signal against the two noises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .truth import GroundTruthModel, edge_mask

__all__ = ["PlantedSpec", "planted_induction", "TRUE_EDGES"]

TRUE_EDGES = ("input->a0.h0<v>", "a0.h0->a1.h0<k>", "input->a1.h0<v>", "a1.h0->logits")
ATTENTION_GAIN = 30.0  # attention logit of a match: the circuit's heads attend almost only there


@dataclass(frozen=True)
class PlantedSpec:
    """Sizes and knobs of a planted induction model (see the module docstring)."""

    n_signal: int = 10  # K signal tokens
    n_background: int = 4  # background tokens per signal token
    seq_len: int = 4  # tokens in each copy: prompts are [BOS] A A[:-1], 2 * seq_len positions
    d_background: int = 24
    n_heads: int = 3
    signal: float = 1.0
    signal_noise: float = 0.5
    background: float = 1.0
    resample: float = 0.5  # share of background tokens the corrupted prompt redraws
    seed: int = 0

    @property
    def n_ctx(self) -> int:
        """Positions of a prompt."""
        return 2 * self.seq_len

    @property
    def vocab_size(self) -> int:
        """Token ids: (signal, background) pairs and BOS."""
        return self.n_signal * self.n_background + 1


def _layout(spec: PlantedSpec) -> dict[str, slice]:
    K, P = spec.n_signal, spec.n_ctx
    names = (("bos", 1), ("tok", K), ("pos", P), ("prev", K), ("out", K), ("bg", spec.d_background))
    out, start = {}, 0
    for name, width in names:
        out[name] = slice(start, start + width)
        start += width
    return out


def _signal_heads(state: dict, spec: PlantedSpec, lay: dict[str, slice], d_head: int) -> None:
    """Write the previous-token head (a0.h0) and the induction head (a1.h0) into ``state``."""
    import torch

    K, P = spec.n_signal, spec.n_ctx
    g = ATTENTION_GAIN * math.sqrt(d_head)  # the model divides q·k by sqrt(d_head)
    WQ0, WK0 = torch.zeros(state["blocks.0.W_Q"].shape[1:]), torch.zeros(state["blocks.0.W_K"].shape[1:])
    for i in range(1, P):  # query at position i matches key at position i - 1
        WQ0[lay["pos"].start + i, i] = g
        WK0[lay["pos"].start + i - 1, i] = 1.0
    state["blocks.0.W_Q"][0], state["blocks.0.W_K"][0] = WQ0, WK0
    for k in range(K):
        state["blocks.0.W_V"][0][lay["tok"].start + k, k] = 1.0
        state["blocks.0.W_O"][0][k, lay["prev"].start + k] = 1.0
        state["blocks.1.W_Q"][0][lay["tok"].start + k, k] = g
        state["blocks.1.W_K"][0][lay["prev"].start + k, k] = 1.0
        state["blocks.1.W_V"][0][lay["tok"].start + k, k] = 1.0
        state["blocks.1.W_O"][0][k, lay["out"].start + k] = 1.0


def _background(state: dict, spec: PlantedSpec, lay: dict[str, slice], gen) -> None:
    """Random background heads (1..H-1 of both layers), MLPs and embeddings, confined to the background."""
    import torch

    bg, Db = lay["bg"], spec.d_background
    rnd = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    for layer in range(2):
        b = f"blocks.{layer}"
        for h in range(1, spec.n_heads):
            for w in ("W_Q", "W_K", "W_V"):
                state[f"{b}.{w}"][h][bg] = rnd(Db, state[f"{b}.{w}"].shape[-1]) / math.sqrt(Db)
            state[f"{b}.W_O"][h][:, bg] = rnd(state[f"{b}.W_O"].shape[1], Db) / math.sqrt(state[f"{b}.W_O"].shape[1])
        F = state[f"{b}.W_in"].shape[1]
        state[f"{b}.W_in"][bg] = rnd(Db, F) / math.sqrt(Db)
        state[f"{b}.b_in"][:] = 0.1 * rnd(F)
        state[f"{b}.W_out"][:, bg] = rnd(F, Db) / math.sqrt(F)


def planted_model(spec: PlantedSpec):
    """The planted induction model (float32 CircuitModel, eval mode) of ``spec``."""
    import torch

    from circuitstat.circuits.model import CircuitModel, ModelConfig

    lay = _layout(spec)
    D = lay["bg"].stop
    d_head = max(spec.n_ctx, spec.n_signal)
    K, B = spec.n_signal, spec.n_background
    cfg = ModelConfig(n_layers=2, n_heads=spec.n_heads, d_model=D, d_head=d_head, d_mlp=2 * spec.d_background,
                      vocab_size=spec.vocab_size, n_ctx=spec.n_ctx, norm="none", positional="learned",
                      mlp="standard", act="relu", arch="planted-induction")
    state = {k: torch.zeros_like(v) for k, v in CircuitModel(cfg).state_dict().items()}
    gen = torch.Generator().manual_seed(int(spec.seed))
    bg_tokens = torch.randn(B + 1, spec.d_background, generator=gen)  # background embeddings (+ BOS's)
    for s in range(K):
        for b in range(B):
            state["W_E"][s * B + b, lay["tok"].start + s] = 1.0
            state["W_E"][s * B + b, lay["bg"]] = bg_tokens[b]
    state["W_E"][K * B, lay["bos"].start] = 1.0
    state["W_E"][K * B, lay["bg"]] = bg_tokens[B]
    state["W_pos"][:, lay["pos"]] = torch.eye(spec.n_ctx)
    _signal_heads(state, spec, lay, d_head)
    _background(state, spec, lay, gen)
    noise = torch.randn(K, K, generator=gen)
    R = torch.randn(K, spec.d_background, generator=gen) / math.sqrt(spec.d_background)
    for s in range(K):
        cols = slice(s * B, (s + 1) * B)
        state["W_U"][lay["out"], cols] = (spec.signal * torch.eye(K)[s] + spec.signal_noise * noise[s])[:, None]
        state["W_U"][lay["bg"], cols] = spec.background * R[s][:, None]
    state["lnf_w"][:], state["lnf_b"][:] = 1.0, 0.0  # unused without norms; kept at their defaults
    for layer in range(2):
        state[f"blocks.{layer}.ln1_w"][:] = 1.0
        state[f"blocks.{layer}.ln2_w"][:] = 1.0
    model = CircuitModel.from_state_dict(cfg, state).eval().requires_grad_(False)
    model.source = f"planted:induction?{spec_query(spec)}"
    model.meta = {"groundtruth": "planted-induction", "spec": spec.__dict__}
    return model


def spec_query(spec: PlantedSpec) -> str:
    """The spec as ``key=value&...`` (the ``planted:induction?...`` source form)."""
    return "&".join(f"{k}={v}" for k, v in spec.__dict__.items())


def planted_task(spec: PlantedSpec, n: int, seed: int, metric: str = "logit_diff"):
    """Induction prompts ``[BOS] A A[:-1]`` (A: distinct signal tokens) with random background tokens.

    The corrupted prompt replaces the first copy by disjoint signal tokens A' (answer A[-1], wrong answer
    A'[-1]: an exchangeable pair) and redraws each background token with probability ``resample``.
    """
    from circuitstat.circuits.tasks import task_from_token_lists

    K, B, S = spec.n_signal, spec.n_background, spec.seq_len
    if 2 * S > K:
        raise ValueError(f"seq_len={S} needs at least {2 * S} signal tokens for two disjoint copies; got {K}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x91A7]))
    bos = K * B
    clean, corr, ans, wrong = [], [], [], []
    for _ in range(int(n)):
        draw = rng.permutation(K)
        A, A2 = draw[:S], draw[S:2 * S]
        sig_c = np.concatenate([A, A[:-1]])
        sig_x = np.concatenate([A2, A[:-1]])
        bg_c = rng.integers(B, size=2 * S - 1)
        bg_x = np.where(rng.random(2 * S - 1) < spec.resample, rng.integers(B, size=2 * S - 1), bg_c)
        clean.append([bos] + (sig_c * B + bg_c).tolist())
        corr.append([bos] + (sig_x * B + bg_x).tolist())
        ans.append(int(A[-1]) * B)
        wrong.append(int(A2[-1]) * B)
    return task_from_token_lists("planted-induction", clean, corr, ans, wrong, pad_id=bos, metric=metric,
                                 meta={"seed": int(seed), "planted": spec_query(spec)})


def planted_induction(spec: PlantedSpec | None = None, metric: str = "logit_diff") -> GroundTruthModel:
    """The planted induction model of ``spec`` with its true circuit, nulls and task generator."""
    spec = spec or PlantedSpec()
    model = planted_model(spec)
    g = model.graph
    truth = edge_mask(g, TRUE_EDGES)
    heads = {f"a{L}.h0" for L in range(2)}
    senders = np.asarray(g.senders)[g.edge_sender]
    receivers = np.asarray([g.receiver_node(r) for r in g.edge_receiver])
    # background edges: both ends in the background (the input's background part feeds them; every
    # receiver but the signal heads' reads the background, and logits read it through R)
    background = ~np.isin(senders, list(heads)) & ~np.isin(receivers, list(heads))
    return GroundTruthModel(
        name="planted:induction", kind="planted", model=model, truth=truth, null_edges=~truth,
        make_task=lambda n, seed: planted_task(spec, n, seed, metric), describe="induction circuit planted "
        f"in a random 2-layer model (signal {spec.signal}, signal noise {spec.signal_noise}, background "
        f"{spec.background})", per_example_nulls=background & ~truth, meta={"spec": dict(spec.__dict__)})
