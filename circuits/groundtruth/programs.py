"""The compiled ground-truth programs in pure Python: what each computes at the read-out, and its task.

Each program is a RASP program compiled by tracr with ``causal=True`` (circuitstat.circuits.groundtruth.tracr_convert
builds the RASP side; this module never imports tracr or jax).  circuitstat reads metrics at the last
real token, where a causal model has seen the whole prompt, so every program is described by what it
outputs *at the last position* under causal masking (tracr's own ``causal_eval`` semantics; the
conversion checks these functions against it and against the compiled model):

* ``frac_prevs``: share of ``x`` tokens in the prompt (numerical output);
* ``reverse``: the first token (``reverse`` at the last position: opp_index = length - index - 1 = 0);
* ``hist``: how often the last token occurs;
* ``sort``: tracr's ``make_sort_unique`` at the last position: the last token if it is the unique
  maximum (every earlier key's causal target position is below the last index), else no key is
  selected and the output is the zero vector;
* ``detect_abc``: whether the prompt ends in ``a b c``;
* ``dyck``: whether the parentheses are balanced (``make_shuffle_dyck(["()"])``).

Each task corrupts exactly what moves the output, so that clean and corrupted prompts have the same
length and the metric difference m(clean) - m(corrupted) is positive in every example.  Tokens are
the RASP values written as strings (``"1"`` for the integer 1), the form the fixtures store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["ProgramSpec", "PROGRAMS", "reference_output", "sample_pairs"]

BOS = "BOS"


@dataclass(frozen=True)
class ProgramSpec:
    """A compiled program: its vocabulary, maximum length, output kind and read-out function."""

    name: str
    vocab: tuple[str, ...]
    max_seq_len: int
    numerical: bool
    describe: str
    readout: Callable[[list[str]], str | float | None]
    pairs: Callable[[np.random.Generator, int], tuple[list[str], list[str], str, str]]


def _frac(tokens: list[str]) -> float:
    return sum(t == "x" for t in tokens) / len(tokens)


def _frac_pair(rng: np.random.Generator, L: int) -> tuple[list[str], list[str], str, str]:
    others = ["w", "y", "z"]
    clean = list(rng.choice(["w", "x", "y", "z"], size=L))
    clean[int(rng.integers(L))] = "x"  # at least one x, so the corruption moves the output
    corrupted = [str(rng.choice(others)) if t == "x" else str(t) for t in clean]
    return [str(t) for t in clean], corrupted, "value", "zero"


def _reverse_pair(rng: np.random.Generator, L: int) -> tuple[list[str], list[str], str, str]:
    vocab = ["a", "b", "c", "d"]
    clean = [str(t) for t in rng.choice(vocab, size=L)]
    corrupted = list(clean)
    corrupted[0] = str(rng.choice([v for v in vocab if v != clean[0]]))
    return clean, corrupted, clean[0], corrupted[0]


def _hist(tokens: list[str]) -> str:
    return str(sum(t == tokens[-1] for t in tokens))


def _hist_pair(rng: np.random.Generator, L: int) -> tuple[list[str], list[str], str, str]:
    vocab = ["a", "b", "c"]
    clean = [str(t) for t in rng.choice(vocab, size=L)]
    j = int(rng.integers(L - 1))
    clean[j] = clean[-1]  # the last token occurs at least twice
    corrupted = list(clean)
    same = [i for i in range(L - 1) if clean[i] == clean[-1]]
    i = int(rng.choice(same))
    corrupted[i] = str(rng.choice([v for v in vocab if v != clean[-1]]))
    return clean, corrupted, _hist(clean), _hist(corrupted)


def _sort_last(tokens: list[str]) -> str | None:
    keys = [int(t) for t in tokens]
    return tokens[-1] if all(k < keys[-1] for k in keys[:-1]) else None


def _sort_pair(rng: np.random.Generator, L: int) -> tuple[list[str], list[str], str, str]:
    keys = [int(k) for k in rng.choice(np.arange(1, 6), size=L, replace=False)]  # distinct keys in 1..5
    top = max(keys)
    keys = [k for k in keys if k != top] + [top]  # the maximum last (the rest in random order)
    clean = [str(k) for k in keys]
    corrupted = list(clean)
    bigger = [v for v in range(keys[-1] + 1, 7)]  # 6 is never in the clean prompt
    new = int(rng.choice(bigger))
    corrupted[int(rng.integers(L - 1))] = str(new)
    return clean, corrupted, clean[-1], str(new)


def _detect(tokens: list[str]) -> str:
    return str(tokens[-3:] == ["a", "b", "c"])


def _detect_pair(rng: np.random.Generator, L: int) -> tuple[list[str], list[str], str, str]:
    vocab = ["a", "b", "c"]
    clean = [str(t) for t in rng.choice(vocab, size=L - 3)] + ["a", "b", "c"]
    corrupted = list(clean)
    i = L - 3 + int(rng.integers(3))
    corrupted[i] = str(rng.choice([v for v in vocab if v != clean[i]]))
    return clean, corrupted, "True", "False"


def _balanced(tokens: list[str]) -> str:
    depth = 0
    for t in tokens:
        depth += 1 if t == "(" else -1
        if depth < 0:
            return "False"
    return str(depth == 0)


def _dyck_pair(rng: np.random.Generator, L: int) -> tuple[list[str], list[str], str, str]:
    while True:  # rejection sampling: 2 of the 16 prompts of length 4 are balanced
        clean = [str(t) for t in rng.choice(["(", ")"], size=L)]
        if _balanced(clean) == "True":
            break
    corrupted = list(clean)
    i = int(rng.integers(L))
    corrupted[i] = "(" if clean[i] == ")" else ")"
    return clean, corrupted, "True", "False"


PROGRAMS: dict[str, ProgramSpec] = {p.name: p for p in (
    ProgramSpec("frac_prevs", ("w", "x", "y", "z"), 5, True, "share of x tokens in the prompt", _frac, _frac_pair),
    ProgramSpec("reverse", ("a", "b", "c", "d"), 5, False, "reverse at the last position: the first token",
                lambda t: t[0], _reverse_pair),
    ProgramSpec("hist", ("a", "b", "c"), 5, False, "how often the last token occurs", _hist, _hist_pair),
    ProgramSpec("sort", tuple(str(k) for k in range(1, 7)), 4, False,
                "make_sort_unique at the last position: the last token if it is the unique maximum, else none",
                _sort_last, _sort_pair),
    ProgramSpec("detect_abc", ("a", "b", "c"), 5, False, "whether the prompt ends in a b c", _detect, _detect_pair),
    ProgramSpec("dyck", ("(", ")"), 4, False, "whether the parentheses are balanced", _balanced, _dyck_pair),
)}


def reference_output(name: str, tokens: list[str]) -> str | float | None:
    """The program's output at the last position of ``tokens`` (BOS excluded), as the fixture writes it."""
    return PROGRAMS[name].readout(list(tokens))


def sample_pairs(name: str, n: int, seed: int) -> list[tuple[list[str], list[str], str, str]]:
    """``n`` (clean, corrupted, answer, wrong answer) prompt pairs of program ``name`` (BOS excluded)."""
    spec = PROGRAMS[name]
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x7AC5]))
    return [spec.pairs(rng, spec.max_seq_len) for _ in range(int(n))]
