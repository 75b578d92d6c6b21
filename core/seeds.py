"""Seeds: the one conversion to a numpy SeedSequence, its reproducible children, and its record in reports.

DESIGN: one root ``numpy.random.SeedSequence`` per run, spawned per work chunk; the seed and its
entropy are recorded in every report (``seed_record``), so ``SeedSequence(entropy, spawn_key=...)``
replays the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_seed_sequence", "spawn_seeds", "seed_record"]


def as_seed_sequence(seed: int | np.random.SeedSequence | None) -> np.random.SeedSequence:
    """Return a SeedSequence for `seed` (fresh OS entropy when None, recorded for replay)."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if isinstance(seed, np.random.Generator):
        raise TypeError(
            "pass an int or numpy.random.SeedSequence as seed, not a Generator: "
            "a Generator's state cannot be recorded in reports"
        )
    return np.random.SeedSequence(seed)


def spawn_seeds(seed: int | np.random.SeedSequence | None, n: int) -> list[np.random.SeedSequence]:
    """Return `n` independent child SeedSequences of `seed` (child i is the same on every call)."""
    root = as_seed_sequence(seed)
    # Build children from (entropy, spawn_key + (i,)) rather than root.spawn(): spawn() is
    # stateful, so calling it twice would give different children.
    return [
        np.random.SeedSequence(root.entropy, spawn_key=tuple(root.spawn_key) + (i,),
                               pool_size=root.pool_size)
        for i in range(n)
    ]


def seed_record(seed: int | np.random.SeedSequence | None) -> dict[str, Any]:
    """Return {'entropy', 'spawn_key', 'pool_size'} of a SeedSequence (or of one built from an int/None).

    The entropy is what reproduces the run: np.random.SeedSequence(entropy, spawn_key=...) .
    """
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    entropy = ss.entropy
    return {"entropy": int(entropy) if isinstance(entropy, (int, np.integer)) else entropy,
            "spawn_key": [int(k) for k in ss.spawn_key], "pool_size": ss.pool_size}
