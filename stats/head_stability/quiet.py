"""NaN-aware reductions without the all-NaN RuntimeWarning: an all-NaN slice is NaN, kept and documented."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


@contextmanager
def quiet() -> Iterator[None]:
    """Yield with the all-NaN RuntimeWarnings of numpy's nan-reductions silenced (NaN results are kept)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def quiet_nanmean(values: np.ndarray, axis: Any = None) -> np.ndarray:
    """Return np.nanmean without the all-NaN warning (an all-NaN slice is NaN, documented)."""
    with quiet():
        return np.nanmean(values, axis=axis)
