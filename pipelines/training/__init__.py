"""Multi-seed training of small GPT-style CircuitModels on a real corpus, deterministically.

One model per seed; the seed sets both the initialisation and the data order. Runs are bitwise
reproducible on the same machine and library versions (torch deterministic algorithms, a fixed
number of threads per model, no dropout, data order a pure function of (seed, step)), and a run
killed at any point resumes from its last checkpoint to exactly the weights an uninterrupted run
ends with (the checkpoint holds weights, optimizer state, RNG states and the step).

Layout of a model directory (loads with ``circuits.load_model(DIR)``)::

    DIR/config.json            model config + meta (seed, recipe, optimizer, corpus/tokenizer hashes, ...)
    DIR/model.safetensors      weights (config.json carries their sha256 as weight_hash)
    DIR/tokenizer.json ...     the tokenizer
    DIR/train_log.parquet      step, train loss, validation loss, lr, tokens, elapsed seconds
    DIR/token_counts.npy       how often each token id occurs in the training split
    DIR/checkpoint.safetensors only while training (removed when done unless keep_checkpoint);
                               tensors + a JSON header, never a pickle (see :mod:`.checkpoint`)

Modules: :mod:`.recipe` (TrainRecipe, DataSpec), :mod:`.data` (tokenizer, token streams, batches),
:mod:`.determinism`, :mod:`.loop` (one model: :func:`train_model`), :mod:`.checkpoint`,
:mod:`.model_dir` (a finished model's directory), :mod:`.jobs` (many models: :func:`train_models`,
:func:`run_train_jobs`; :func:`parse_seeds` and :func:`check_out_dir` check the options of the
``train`` command in pipelines/cli/studies.py).
"""

from circuitstat.circuits.cache import cache_dir  # re-exported: the zoo and the head study use it

from .checkpoint import CHECKPOINT, CHECKPOINT_FORMAT, FORMAT_VERSION, LEGACY_CHECKPOINT, read_checkpoint_info
from .data import prepare_data
from .determinism import use_deterministic
from .jobs import MAX_SEEDS, TrainJob, parse_seeds, run_train_jobs, train_models
from .loop import GPT2_INIT_STD, train_model
from .model_dir import LOG_TABLE, check_out_dir, is_complete, model_dir_name
from .recipe import DataSpec, TrainRecipe

__all__ = [
    "TrainRecipe",
    "DataSpec",
    "train_model",
    "train_models",
    "prepare_data",
    "parse_seeds",
    "cache_dir",
    "model_dir_name",
    "is_complete",
    # also public before the split (imported by name elsewhere)
    "CHECKPOINT",
    "CHECKPOINT_FORMAT",
    "FORMAT_VERSION",
    "LEGACY_CHECKPOINT",
    "LOG_TABLE",
    "GPT2_INIT_STD",
    "MAX_SEEDS",
    "TrainJob",
    "check_out_dir",
    "read_checkpoint_info",
    "run_train_jobs",
    "use_deterministic",
]
