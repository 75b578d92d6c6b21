"""Models already in memory: load_model(hf_model, tokenizer), nnsight's wrapper, and clear refusals (issue 23)."""

from __future__ import annotations

import pytest
import torch

from circuitstat.core.errors import InputError

SOURCE = "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=50257&n_positions=64&seed=4"


@pytest.fixture(scope="module")
def hf():
    from circuitstat.circuits import load_hf

    return load_hf(SOURCE)


@pytest.fixture(scope="module")
def hf_tokenizer():
    """A transformers tokenizer object (GPT-2's BPE from the vocabulary circuitstat ships, no download)."""
    from transformers import PreTrainedTokenizerFast

    from circuitstat.circuits.tokenizers import gpt2_tokenizer

    return PreTrainedTokenizerFast(tokenizer_object=gpt2_tokenizer().backend, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>")


def test_a_hugging_face_model_object_and_its_tokenizer_load(hf, hf_tokenizer):
    """Today: load_model(hf_model) fails with OSError (File name too long) and build_task with AttributeError."""
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    model = load_model(hf, tokenizer=hf_tokenizer)
    ids = torch.tensor([hf_tokenizer.encode(" When Mary and John went to the store, John gave a drink to")])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=0, atol=1e-4)
    assert model.tokenizer.encode(" Mary") == hf_tokenizer.encode(" Mary")
    task = build_task(model, "ioi", n=4)  # a task that needs the tokenizer
    assert task.clean.shape[0] == 4 and model.source.startswith("memory:GPT2LMHeadModel")


def test_the_model_inside_an_nnsight_wrapper_is_used_with_its_tokenizer(hf, hf_tokenizer):
    from circuitstat.circuits import load_model

    class LanguageModelLike:  # nnsight's LanguageModel keeps the HF model as ._model and its tokenizer
        def __init__(self, m, tok):
            self._model, self.tokenizer = m, tok

    model = load_model(LanguageModelLike(hf, hf_tokenizer))
    assert model.weight_hash() == load_model(hf).weight_hash() and model.tokenizer is not None


def test_what_cannot_be_loaded_says_what_to_pass(hf):
    from circuitstat.circuits import load_model
    from circuitstat.pipelines.build import build_task

    class HookedTransformerLike:
        cfg = type("cfg", (), {"d_vocab": 50257})()
        blocks = []

    with pytest.raises(InputError, match="TransformerLens HookedTransformer.*AutoModelForCausalLM"):
        load_model(HookedTransformerLike())
    with pytest.raises(InputError, match="neither a source .* nor a Hugging Face causal LM"):
        load_model(object())
    with pytest.raises(InputError, match=r"build_task needs a CircuitModel.*load_model\(model, tokenizer\)"):
        build_task(hf, "induction", n=4)
    with torch.device("meta"):
        undispatched = type(hf)(hf.config)
    with pytest.raises(InputError, match=r"weights are not loaded \(meta tensors\).*dispatch=True"):
        load_model(undispatched)
    with pytest.raises(InputError, match="goes with a model in memory"):
        load_model(SOURCE, tokenizer="gpt2")
