"""The base of every spec section (StrictSpec): kept apart from circuitstat.pipelines.spec so that the sections
declared beside their own rules (the mask fits' options, circuitstat.pipelines.mask_options) need not import the
audit spec that includes them."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from circuitstat.core.errors import warn_renamed

__all__ = ["StrictSpec"]


class StrictSpec(BaseModel):
    """The base of every spec section: strict types, frozen, no unknown keys (old keys read with a warning)."""

    # strict: no silent coercion (true -> 1, "3" -> 3); ints are still accepted for floats.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    #: old key -> new key of this section: an old key is still read, with a warning naming the new one
    _renamed: ClassVar[dict[str, str]] = {}
    #: how a key of this section is named in messages ("heads." for the audit spec's heads section)
    _section: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _read_renamed_keys(cls, data: Any) -> Any:
        """``data`` with each old key renamed to its new one (one name per concept; old specs keep working)."""
        if not isinstance(data, dict) or not any(old in data for old in cls._renamed):
            return data
        data = dict(data)
        for old, new in cls._renamed.items():
            if old in data:
                if new in data:
                    raise ValueError(f"give {cls._section}{new} only ({cls._section}{old} is its old name)")
                warn_renamed(f"{cls._section}{old}", f"{cls._section}{new}", "spec", stacklevel=2)
                data[new] = data.pop(old)
        return data
