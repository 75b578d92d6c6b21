"""Task metrics, read at each example's last real token.

Every metric is ``metric(logits, batch, clean_logits=None, indices=None) -> Tensor[B]`` (float32, float64 for
float64 logits; differentiable in ``logits``):

* ``logits``: ``[B, P, V]`` (read at ``batch.last_pos``) or already ``[B, V]`` at the last token;
* ``batch``: a :class:`circuitstat.circuits.tasks.Task` with B rows (e.g. ``task.select(idx)``), or the whole
  task together with ``indices`` (B row numbers);
* ``clean_logits``: the clean run's logits (same shapes), needed by KL; treated as a constant
  target (detached).

Built-in metrics (:data:`METRICS`):

``logit_diff``     logit[answer] - logit[wrong_answer]
``prob_diff``      p[answer] - p[wrong_answer]; for tasks with candidate sets (greater-than):
                   sum of p over the "good" candidates minus sum over the "bad" ones
``kl``             KL(p_clean || p) summed over the vocabulary (ACDC's convention)
``kl_mean``        the same divided by the vocabulary size (MIB's convention) -- an explicit choice
``cross_entropy``  -log p[answer]

:func:`get_metric` turns a name or a user callable into a :class:`Metric`, which checks shapes and
NaNs and casts to float32 (float64 logits keep float64: a float64 model's metrics are float64 end to end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .engine.config import compute_dtype

from circuitstat.core.errors import InputError

__all__ = [
    "Metric",
    "MetricError",
    "METRICS",
    "get_metric",
    "last_token_logits",
    "logit_diff",
    "prob_diff",
    "kl_div",
    "kl_div_mean",
    "cross_entropy",
]


class MetricError(InputError):
    """A metric was misconfigured or produced an unusable value."""


@dataclass
class _Rows:
    last_pos: torch.Tensor
    answer: torch.Tensor
    wrong_answer: torch.Tensor
    candidates: torch.Tensor | None
    good: torch.Tensor | None
    bad: torch.Tensor | None


def _rows(batch, indices, device) -> _Rows:
    """Per-example fields of the rows being scored, on ``device``."""
    def take(t):
        if t is None:
            return None
        if indices is not None:
            t = t[torch.as_tensor(indices, device=t.device, dtype=torch.long)]
        return t.to(device)

    cand = getattr(batch, "candidates", None)
    return _Rows(
        last_pos=take(batch.last_pos),
        answer=take(batch.answer),
        wrong_answer=take(batch.wrong_answer),
        candidates=None if cand is None else cand.to(device),
        good=take(getattr(batch, "good", None)),
        bad=take(getattr(batch, "bad", None)),
    )


def last_token_logits(logits: torch.Tensor, batch, indices=None) -> torch.Tensor:
    """``[B, V]`` float32 (float64 for float64) logits at each example's last real token (``[B, V]`` input passes
    through)."""
    if logits.ndim == 2:
        return logits.to(compute_dtype(logits.dtype))
    if logits.ndim != 3:
        raise MetricError(f"logits must be [B, P, V] or [B, V], got shape {tuple(logits.shape)}")
    r = _rows(batch, indices, logits.device)
    if r.last_pos.shape[0] != logits.shape[0]:
        raise MetricError(
            f"logits have {logits.shape[0]} rows but the batch has {r.last_pos.shape[0]} examples; "
            "pass task.select(indices) or indices=..."
        )
    if int(r.last_pos.max()) >= logits.shape[1]:
        raise MetricError(f"logits have {logits.shape[1]} positions, fewer than the prompts' lengths")
    ar = torch.arange(logits.shape[0], device=logits.device)
    return logits[ar, r.last_pos].to(compute_dtype(logits.dtype))


def _gather(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return x.gather(1, ids.long().unsqueeze(1)).squeeze(1)


def logit_diff(logits, batch, clean_logits=None, indices=None) -> torch.Tensor:
    """logit[answer] - logit[wrong_answer] at the last real token."""
    x = last_token_logits(logits, batch, indices)
    r = _rows(batch, indices, x.device)
    return _gather(x, r.answer) - _gather(x, r.wrong_answer)


def prob_diff(logits, batch, clean_logits=None, indices=None) -> torch.Tensor:
    """p[answer] - p[wrong]; with candidate sets: sum p[good] - sum p[bad]."""
    x = last_token_logits(logits, batch, indices)
    p = torch.softmax(x, dim=-1)
    r = _rows(batch, indices, x.device)
    if r.candidates is not None and r.good is not None and r.bad is not None:
        pc = p[:, r.candidates.long()]  # [B, K]
        return (pc * r.good.float()).sum(-1) - (pc * r.bad.float()).sum(-1)
    return _gather(p, r.answer) - _gather(p, r.wrong_answer)


def kl_div(logits, batch, clean_logits=None, indices=None, reduction: str = "sum") -> torch.Tensor:
    """KL(p_clean || p) at the last real token; ``reduction="sum"`` over the vocabulary, or ``"mean"``."""
    if clean_logits is None:
        raise MetricError("the KL metric needs clean_logits (the clean run's logits)")
    if reduction not in ("sum", "mean"):
        raise MetricError(f"KL reduction must be 'sum' or 'mean', got {reduction!r}")
    x = last_token_logits(logits, batch, indices)
    c = last_token_logits(clean_logits.detach(), batch, indices)
    logp = torch.log_softmax(x, dim=-1)
    logq = torch.log_softmax(c, dim=-1)
    kl = (logq.exp() * (logq - logp)).sum(-1)
    return kl / x.shape[-1] if reduction == "mean" else kl


def kl_div_mean(logits, batch, clean_logits=None, indices=None) -> torch.Tensor:
    """KL(p_clean || p) averaged over the vocabulary (MIB's convention)."""
    return kl_div(logits, batch, clean_logits, indices, reduction="mean")


def cross_entropy(logits, batch, clean_logits=None, indices=None) -> torch.Tensor:
    """-log p[answer] at the last real token."""
    x = last_token_logits(logits, batch, indices)
    r = _rows(batch, indices, x.device)
    return -_gather(torch.log_softmax(x, dim=-1), r.answer)


METRICS: dict[str, Callable] = {
    "logit_diff": logit_diff,
    "prob_diff": prob_diff,
    "kl": kl_div,
    "kl_mean": kl_div_mean,
    "cross_entropy": cross_entropy,
}
_ALIASES = {
    "logit-diff": "logit_diff", "logitdiff": "logit_diff", "logit_difference": "logit_diff",
    "prob-diff": "prob_diff", "probdiff": "prob_diff", "probability_difference": "prob_diff",
    "kl_sum": "kl", "kl-sum": "kl", "kl_div": "kl", "kl-div": "kl", "kl-mean": "kl_mean",
    "ce": "cross_entropy", "cross-entropy": "cross_entropy", "xent": "cross_entropy",
}
NEEDS_CLEAN = {"kl", "kl_mean"}


@dataclass
class Metric:
    """A named metric: ``metric(logits, batch, clean_logits=None, indices=None) -> float32 [B]`` (float64 for
    float64 logits)."""

    name: str
    fn: Callable
    kwargs: dict[str, Any] = field(default_factory=dict)
    needs_clean: bool = False
    check_nan: bool = True

    def __call__(self, logits, batch, clean_logits=None, indices=None) -> torch.Tensor:
        if self.needs_clean and clean_logits is None:
            raise MetricError(f"metric {self.name!r} needs clean_logits (the clean run's logits)")
        out = self.fn(logits, batch, clean_logits, indices, **self.kwargs)
        if not isinstance(out, torch.Tensor):
            raise MetricError(f"metric {self.name!r} returned {type(out).__name__}, not a tensor")
        b = logits.shape[0]
        if out.shape != (b,):
            raise MetricError(
                f"metric {self.name!r} returned shape {tuple(out.shape)}; a metric must return one "
                f"value per example, shape ({b},)"
            )
        out = out.to(compute_dtype(logits.dtype)) if logits.dtype == torch.float64 else out.float()
        if self.check_nan:
            bad = ~torch.isfinite(out.detach())
            if bool(bad.any()):
                rows = torch.nonzero(bad).flatten()[:10].tolist()
                raise MetricError(
                    f"metric {self.name!r} is NaN/inf for batch rows {rows}: check the model's logits "
                    "(overflow in half precision?) and the answer ids"
                )
        return out

    def describe(self) -> dict:
        return {"name": self.name, "kwargs": dict(self.kwargs)}


def get_metric(metric: "str | Callable | Metric", **kwargs) -> Metric:
    """A :class:`Metric` from a name (see :data:`METRICS`), a :class:`Metric`, or a user callable
    ``fn(logits, batch, clean_logits=None, indices=None) -> Tensor[B]`` (``kwargs`` are bound)."""
    if isinstance(metric, Metric):
        if kwargs:
            return Metric(metric.name, metric.fn, {**metric.kwargs, **kwargs}, metric.needs_clean, metric.check_nan)
        return metric
    if callable(metric):
        name = getattr(metric, "__name__", type(metric).__name__)
        return Metric(f"user:{name}", _user(metric), dict(kwargs))
    if not isinstance(metric, str):
        raise MetricError(f"a metric is a name or a callable, got {type(metric).__name__}")
    key = metric.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in METRICS:
        raise MetricError(f"unknown metric {metric!r}; choose one of {sorted(METRICS)} or pass a callable")
    if key == "kl" and "reduction" in kwargs and kwargs["reduction"] == "mean":
        key, kwargs = "kl_mean", {k: v for k, v in kwargs.items() if k != "reduction"}
    _check_kwargs(key, kwargs)
    return Metric(key, METRICS[key], dict(kwargs), needs_clean=key in NEEDS_CLEAN)


def metric_options(name: str) -> list[str]:
    """The keyword options the built-in metric ``name`` accepts (beyond logits, batch, clean_logits, indices)."""
    import inspect

    params = list(inspect.signature(METRICS[name]).parameters)
    return params[4:]


def _check_kwargs(name: str, kwargs: dict) -> None:
    """MetricError naming options a built-in metric does not take (they would fail at its first call)."""
    allowed = metric_options(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes no options"
        raise MetricError(f"metric {name!r}: unknown option(s) {', '.join(map(repr, unknown))}; {takes}")


def _user(fn: Callable) -> Callable:
    """Call a user metric with as many of (logits, batch, clean_logits, indices) as it accepts."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    var = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
    n_pos = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params.values())

    def call(logits, batch, clean_logits, indices, **kw):
        if var or n_pos >= 4:
            return fn(logits, batch, clean_logits, indices, **kw)
        if indices is not None and hasattr(batch, "select"):
            batch = batch.select(indices)
        args = (logits, batch, clean_logits)[: max(n_pos, 1)]
        return fn(*args, **kw)

    return call
