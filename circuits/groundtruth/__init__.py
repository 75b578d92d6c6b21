"""Models whose circuit is known: tracr-compiled RASP programs and circuits planted by construction.

Sources (``load_groundtruth``):

* ``tracr:NAME`` (NAME in circuitstat.circuits.groundtruth.programs.PROGRAMS) or a fixture directory: a compiled
  program (circuitstat.circuits.groundtruth.compiled; the fixtures are written by circuitstat.circuits.groundtruth.tracr_convert,
  which alone needs tracr and jax);
* ``planted:induction`` or ``planted:induction?signal=0.5&background=2``: the planted induction model
  (circuitstat.circuits.groundtruth.planted; any PlantedSpec field may be set).
"""

from __future__ import annotations

from dataclasses import fields
from urllib.parse import parse_qsl

from circuitstat.core.errors import InputError

from .truth import GroundTruthModel, edge_mask

__all__ = ["GroundTruthModel", "edge_mask", "load_groundtruth", "parse_planted"]


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
    if 2 * spec.seq_len > spec.n_signal or min(spec.n_signal, spec.n_background, spec.seq_len, spec.n_heads) < 1:
        raise InputError(f"{source}: need n_signal >= 2 * seq_len and positive sizes")
    if not 0 <= spec.resample <= 1:
        raise InputError(f"{source}: resample is a share in [0, 1]")
    return spec


def load_groundtruth(source: str, metric: str = "logit_diff") -> GroundTruthModel:
    """The model with a known circuit named by ``source`` (see the module docstring)."""
    s = str(source)
    if s.startswith("planted:"):
        from .planted import planted_induction

        return planted_induction(parse_planted(s), metric=metric)
    from .compiled import load_compiled

    return load_compiled(s, metric=metric)
