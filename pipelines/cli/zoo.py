"""The ``zoo`` commands: train one model of the default zoo (``zoo build RECIPE --seed S``), or list
which of its models are trained. ``zoo:RECIPE/seed-S`` names such a model wherever a model source goes."""

from __future__ import annotations

import typer

from circuitstat.core.params import N_JOBS

from .app import BoundaryGroup, app, echo

zoo_app = typer.Typer(cls=BoundaryGroup, no_args_is_help=True,
                      help="The default zoo (small models trained on the standard library's source, cached): "
                           "build one recipe and seed, or list what is trained.")
app.add_typer(zoo_app, name="zoo")

ZOO_RECIPES_HELP = "attn-only-2l or mlp-2l"  # circuitstat.pipelines.zoo.ZOO_RECIPES, written out so --help does not import torch


@zoo_app.command("build")
def zoo_build_command(
    recipe: str | None = typer.Argument(None, help=f"the recipe ({ZOO_RECIPES_HELP}); default: every recipe"),
    seeds: str = typer.Option("0-4", "--seed", "--seeds", help="seeds to train, e.g. 1, 0-4 or 0,2"),
    n_jobs: int = typer.Option(N_JOBS.default, "--n-jobs", min=N_JOBS.minimum, help="models trained in parallel (1 to the CPU count)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
) -> None:
    """Train (or reuse) the zoo's models of one recipe and seed, e.g. `zoo build attn-only-2l --seed 1`.

    Cost: about 2.5 min per model on one core (3,500 steps of a 2-layer, d_model 64 model; the whole zoo,
    10 models, took 12 min 20 s on 2 cores); a trained model is cached by content and reused."""
    from circuitstat.core.errors import InputError
    from circuitstat.pipelines.build import check_device, check_n_jobs
    from circuitstat.pipelines.training import parse_seeds
    from circuitstat.pipelines.zoo import ZOO_RECIPES, default_zoo

    if recipe is not None and recipe not in ZOO_RECIPES:
        raise InputError(f"no zoo recipe {recipe!r}; recipes: {', '.join(ZOO_RECIPES)}")
    seed_list = parse_seeds(seeds)
    n_jobs, device = check_n_jobs(n_jobs), check_device(device)
    recipes = ZOO_RECIPES if recipe is None else {recipe: ZOO_RECIPES[recipe]}
    for path in default_zoo(n_jobs=n_jobs, recipes=recipes, seeds=seed_list, device=device):
        echo(f"zoo:{path.parent.name.rsplit('-', 1)[0]}/{path.name}  {path}")


@zoo_app.command("list")
def zoo_list_command() -> None:
    """Each zoo recipe and seed, whether it is trained, its weight hash (sha256, as every run's provenance records
    it) and where it is cached. The cache key covers the recipe, the corpus, the training code's version, the
    torch/numpy/tokenizers versions and the CPU's kernel level, so a model built elsewhere can be compared."""
    from circuitstat.pipelines.zoo import ZOO_RECIPES, ZOO_SEEDS, model_weight_hash, recipe_dir, weight_environment

    env = weight_environment()
    echo("environment of the cache key: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    for name in ZOO_RECIPES:
        root = recipe_dir(name)
        for s in ZOO_SEEDS:
            digest = model_weight_hash(root / f"seed-{s}")
            state = f"trained  weights sha256:{digest}" if digest else "not trained"
            echo(f"zoo:{name}/seed-{s}  {state}  {root / f'seed-{s}'}")
