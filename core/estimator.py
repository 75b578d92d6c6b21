"""The one Estimator base (scikit-learn conventions): parameters in ``__init__``, stored verbatim.

``__init__`` only stores its arguments (no conversion, no validation: that happens in ``fit``), so
``get_params`` returns exactly what was passed, ``set_params`` sets the same attributes, ``clone``
builds an unfitted copy with the same parameters and ``repr`` shows the parameters that differ
from their defaults. A renamed parameter (``_renamed``: old name -> new name) is still accepted by
``__init__`` and ``set_params``, with a :class:`~circuitstat.core.errors.DeprecatedNameWarning` naming the new one.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, ClassVar, TypeVar

from circuitstat.core.errors import InputError, warn_renamed

__all__ = ["Estimator"]

_E = TypeVar("_E", bound="Estimator")


def _translated(cls: type, params: dict[str, Any], stacklevel: int) -> dict[str, Any]:
    """``params`` with renamed keys replaced by their new names (warning for each); InputError for both given."""
    out = dict(params)
    for old, new in cls._renamed.items():
        if old in out:
            if new in out:
                raise InputError(f"{cls.__name__}: give {new!r} only ({old!r} is its old name)")
            warn_renamed(old, new, cls.__name__, stacklevel=stacklevel)
            out[new] = out.pop(old)
    return out


class Estimator:
    """Base class of the estimators: ``get_params``, ``set_params``, ``clone`` and ``repr`` from ``__init__``."""

    #: old parameter name -> new name, still accepted (with a warning)
    _renamed: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or not cls._renamed:
            return

        @functools.wraps(init)  # inspect.signature follows __wrapped__: the parameters stay those of init
        def __init__(self, *args: Any, **params: Any) -> None:
            init(self, *args, **_translated(cls, params, stacklevel=4))

        cls.__init__ = __init__

    @classmethod
    def _param_names(cls) -> list[str]:
        """Return the parameter names, read from the signature of ``__init__``."""
        return [p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    def get_params(self, deep: bool = False) -> dict[str, Any]:
        """Return every ``__init__`` parameter by name, as stored (``deep`` is accepted for scikit-learn)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self: _E, **params: Any) -> _E:
        """Set parameters by name (stored verbatim, checked in ``fit``); return the estimator."""
        params = _translated(type(self), params, stacklevel=4)
        names = self._param_names()
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise InputError(f"unknown {type(self).__name__} parameter(s) {unknown}; use {', '.join(names)}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def clone(self: _E) -> _E:
        """Return a new, unfitted estimator with (deep copies of) the same parameters."""
        return type(self)(**copy.deepcopy(self.get_params()))

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = []
        for name, value in self.get_params().items():
            default = defaults.get(name, inspect.Parameter.empty)
            try:
                same = default is not inspect.Parameter.empty and bool(value == default)
            except (TypeError, ValueError):  # arrays compare elementwise
                same = False
            if not same:
                changed.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(changed)})"
