"""Models whose circuit is known: tracr-compiled RASP programs and circuits planted by construction.

Sources (``load_groundtruth``):

* ``tracr:NAME`` (NAME in circuitstat.circuits.groundtruth.programs.PROGRAMS) or a fixture directory: a compiled
  program (circuitstat.circuits.groundtruth.compiled; the fixtures are written by circuitstat.circuits.groundtruth.tracr_convert,
  which alone needs tracr and jax);
* ``planted:induction`` or ``planted:induction?signal=0.5&background=2``: the planted induction model
  (circuitstat.circuits.groundtruth.planted; any PlantedSpec field may be set).
"""

from __future__ import annotations

import math
from dataclasses import fields
from urllib.parse import parse_qsl

from circuitstat.core.errors import InputError
from circuitstat.core.params import SEED

from .truth import GroundTruthModel, edge_mask

__all__ = ["GroundTruthModel", "edge_mask", "load_groundtruth", "parse_planted"]


PLANTED_RANGES = {
    # sizes: a two-layer toy model whose vocabulary and width fit in memory at once
    "n_signal": (2, 1000), "n_background": (1, 1000), "seq_len": (1, 256), "d_background": (1, 4096),
    "n_heads": (1, 64),
    # scales (signal > 0): their ratios set the difficulty; beyond 1e3 the float32 logits lose the signal
    "signal": (0.0, 1e3), "signal_noise": (0.0, 1e3), "background": (0.0, 1e3),
    "resample": (0.0, 1.0),  # a share of background tokens
    "seed": (SEED.minimum, SEED.maximum),
}
"""Inclusive range of every PlantedSpec knob a ``planted:`` source may set (signal must be positive)."""
MAX_PLANTED_VOCAB = 100_001  # token ids of n_signal x n_background pairs and BOS


def parse_planted(source: str):
    """The PlantedSpec of a ``planted:induction?key=value&...`` source (InputError naming a bad key)."""
    from .planted import PlantedSpec

    body = source.split(":", 1)[1]
    kind, _, query = body.partition("?")
    if kind != "induction":
        raise InputError(f"{source}: unknown planted circuit {kind!r}; use planted:induction")
    known = {f.name: f.type for f in fields(PlantedSpec)}
    values = {}
    for key, text in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key not in known:
            raise InputError(f"{source}: unknown option {key!r}; options: {', '.join(known)}")
        try:
            values[key] = int(text) if known[key] in (int, "int") else float(text)
        except ValueError:
            raise InputError(f"{source}: option {key}={text!r} is not a number") from None
    spec = PlantedSpec(**values)
    for key, (low, high) in PLANTED_RANGES.items():
        v = getattr(spec, key)
        if not (math.isfinite(v) and low <= v <= high) or (key == "signal" and v <= 0):
            use = f"0 < signal <= {high:g}" if key == "signal" else f"{low:g} to {high:g}"
            raise InputError(f"{source}: {key}={v!r} is out of range; use {use}")
    if 2 * spec.seq_len > spec.n_signal:
        raise InputError(f"{source}: need n_signal >= 2 * seq_len (got n_signal={spec.n_signal}, seq_len={spec.seq_len})")
    if spec.vocab_size > MAX_PLANTED_VOCAB:
        raise InputError(f"{source}: n_signal x n_background = {spec.vocab_size - 1:,} token ids, above "
                         f"{MAX_PLANTED_VOCAB - 1:,}; make them smaller")
    return spec


def load_groundtruth(source: str, metric: str = "logit_diff") -> GroundTruthModel:
    """The model with a known circuit named by ``source`` (see the module docstring)."""
    s = str(source)
    if s.startswith("planted:"):
        from .planted import planted_induction

        return planted_induction(parse_planted(s), metric=metric)
    from .compiled import load_compiled

    return load_compiled(s, metric=metric)
