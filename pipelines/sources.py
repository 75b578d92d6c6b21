"""The one model-source resolver: what a run loads for each source it names, and the name it records.

Every command, study and service job resolves its model sources here, through a :class:`RunInputs` passed to
it as an argument (never carried implicitly): a model directory, a cached hub id ``org/name[@revision]`` and
``random:ARCH?...`` load as they are; ``zoo:RECIPE/seed-S`` loads that model of the default zoo's cache;
``served:NAME`` (on a circuitstat server only) loads the operator's model NAME. A loaded model records the
source as it was named (``zoo:...``, ``served:...``), so a server's paths reach no manifest, table or report.
``RunInputs`` also says whether errors and pages may name the paths sources resolve to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from circuitstat.circuits.model_source import Served, Zoo, parse_source
from circuitstat.core.errors import InputError

if TYPE_CHECKING:
    import torch

    from circuitstat.circuits.model import CircuitModel

__all__ = ["LOCAL", "Resolved", "RunInputs"]


@dataclass(frozen=True)
class Resolved:
    """A model source resolved: ``location`` is what circuitstat.circuits.loading loads, ``name`` what runs record."""

    location: str
    name: str


@dataclass(frozen=True)
class RunInputs:
    """Where a run's models come from: the operator's served models (name -> directory) and whether messages and
    pages may name the paths sources resolve to (a server's may not)."""

    served: Mapping[str, str] = field(default_factory=dict)
    hide_paths: bool = False

    def resolve(self, source: "str | os.PathLike") -> Resolved:
        """The location and the recorded name of ``source`` (InputError for a string the source grammar refuses,
        circuitstat.circuits.model_source, or a zoo: or served: name that names no model here)."""
        source = str(source)
        src = parse_source(source, base=".")
        if isinstance(src, Served):
            if src.name not in self.served:
                raise InputError(f"{source}: 'served:' names a model of a circuitstat server, inside one of its jobs "
                                 "only; give a model directory, a hub id, random:ARCH?... or zoo:RECIPE/seed-S")
            return Resolved(str(self.served[src.name]), source)
        if isinstance(src, Zoo):
            return Resolved(self._zoo_dir(src), source)
        return Resolved(source, source)

    def _zoo_dir(self, src: Zoo) -> str:
        """The directory of zoo model ``src`` (``zoo:RECIPE/seed-S``), inside its recipe's cache folder."""
        from circuitstat.core.confine import inside

        from .zoo import ZOO_RECIPES, recipe_dir

        name, model = src.recipe, f"seed-{src.seed}"
        if name not in ZOO_RECIPES:
            raise InputError(f"not a zoo recipe: sources look like zoo:RECIPE/seed-S (recipes: "
                             f"{', '.join(ZOO_RECIPES)}; S a seed number)")
        root = recipe_dir(name)
        path = root / model
        where = "in this server's zoo cache" if self.hide_paths else f"at {path}"
        if not (path / "model.safetensors").exists():
            raise InputError(f"{src.text}: not trained yet (no model {where}); train just this one with "
                             f"`circuitstat zoo build {name} --seed {src.seed}` (about 2.5 minutes on one core, cached), "
                             "or the whole zoo with `python -m circuitstat.pipelines.zoo` (10 models, about 12 minutes "
                             "on 2 cores)")
        if not inside(path, root):
            raise InputError(f"zoo:{name}/{model}: the model {where} is a symbolic link out of the zoo's cache; remove "
                             "it and build the zoo again")
        return str(path)

    def load(self, source: "str | os.PathLike", device: str = "cpu", dtype: "str | torch.dtype | None" = None, *,
             allow_pickle: bool = False, allow_large: bool = False) -> "CircuitModel":
        """The CircuitModel ``source`` names, recording the source as named (the one way to load a model)."""
        from circuitstat.circuits.loading import load_model

        if isinstance(dtype, str):
            import torch

            dtype = getattr(torch, dtype)
        r = self.resolve(source)
        return load_model(r.location, device=device, dtype=dtype, allow_pickle=allow_pickle, allow_large=allow_large,
                          name=r.name)

    def skeleton(self, source: "str | os.PathLike", *, allow_pickle: bool = False, allow_large: bool = False,
                 weights: bool = True) -> "CircuitModel":
        """The model ``source`` names on the meta device (its config and shapes; no weight read or allocated);
        ``weights=False`` accepts a directory holding only config.json (and a tokenizer), for a plan."""
        from circuitstat.circuits.skeleton import load_skeleton

        r = self.resolve(source)
        return load_skeleton(r.location, allow_pickle=allow_pickle, allow_large=allow_large, name=r.name,
                             weights=weights)


LOCAL = RunInputs()
"""The inputs of a command run here: every source the command line takes, paths shown."""
