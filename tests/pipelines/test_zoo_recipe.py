"""The default zoo's recipe forms induction heads (the zoo's reason to exist).

Trains one model of the attention-only zoo recipe exactly as ``default_zoo`` does (same recipe,
seed 0, the standard-library corpus; about two minutes on one core) and measures it on repeated
random tokens: the second repeat must be predicted far better than the first and a layer-1 head
must attend from each token to the one after its earlier occurrence. A recipe change that loses
induction fails here rather than in the README.
"""

import numpy as np
import pytest

from circuitstat.circuits import load_model
from circuitstat.pipelines.training import train_model
from circuitstat.pipelines.zoo import ZOO_RECIPES, induction_metrics


@pytest.mark.slow
def test_attn_only_zoo_recipe_forms_induction_heads(tmp_path):
    recipe = ZOO_RECIPES["attn-only-2l"]
    path = train_model(recipe, 0, tmp_path / "seed-0", progress=False, cache=tmp_path / "cache")
    m = load_model(path)
    r = induction_metrics(m, n=64)
    assert r["seq_len"] * 2 + 1 <= m.cfg.n_ctx
    # induction: the second repeat is predicted far better than the first (random tokens: ~log(pool))
    assert r["loss_first"] > 0.8 * np.log(r["pool_size"])
    assert r["loss_second"] < 0.5 * r["loss_first"]
    ind = r["induction_scores"]
    assert ind[1].max() >= 0.5, ind
    # the layer-0 heads are no induction heads (they cannot be: no earlier layer to shift keys)
    assert ind[0].max() < 0.2, ind
    # and a layer-0 head attends to the previous token (the other half of the circuit)
    assert r["prev_token_scores"][0].max() > 0.2, r["prev_token_scores"]
