"""The claims file as a pydantic model: ``Claim`` (the union of every registered kind's model, told apart by
``kind``) and ``ClaimsFile`` (where the run is, or the spec to make it, and the claims)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Union

from pydantic import Field, PrivateAttr

from ..spec import StrictSpec
from ..yamlio import resolve_inside
from .kinds import KINDS
from .models import ClaimBase

__all__ = ["CLAIM_MODELS", "KIND_MODELS", "Claim", "ClaimsFile"]

#: every kind's model, in the registry's order
CLAIM_MODELS: tuple[type[ClaimBase], ...] = tuple(k.model for k in KINDS.values())
Claim = Annotated[Union[CLAIM_MODELS], Field(discriminator="kind")]
KIND_MODELS: dict[str, type[ClaimBase]] = {k.name: k.model for k in KINDS.values()}


class ClaimsFile(StrictSpec):
    """A claims file: where the run is (or the spec to make it) and the claims."""

    run: str | None = Field(None, min_length=1)
    spec: str | None = Field(None, min_length=1)
    claims: list[Claim] = Field(min_length=1)
    _source: str | None = PrivateAttr(None)  # the file it came from (set by parse_claims)

    @property
    def source(self) -> str | None:
        return self._source

    @property
    def base(self) -> Path:
        """The directory relative paths in the file are relative to."""
        return Path(self.source).parent if self.source else Path(".")

    def run_path(self, allow_outside: bool = False) -> Path | None:
        """``run:`` relative to this file, confined to its directory tree unless `allow_outside`."""
        return None if self.run is None else self._inside(self.run, "run", allow_outside)

    def spec_path(self, allow_outside: bool = False) -> Path | None:
        """``spec:`` relative to this file, confined to its directory tree unless `allow_outside`."""
        return None if self.spec is None else self._inside(self.spec, "spec", allow_outside)

    def _inside(self, value: str, key: str, allow_outside: bool) -> Path:
        # A claims file may come from someone else (a CI job checks published findings): it must
        # not make check read or write outside the tree it was placed in (see resolve_inside).
        return resolve_inside(self.source or Path(".") / "<claims>", value, key=key, allow_outside=allow_outside)
