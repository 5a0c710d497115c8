"""`load_tolerant`, the one tolerant load behind a resume, ``--init_from`` and the checkpoint readers:
a tied head the save dropped is forgiven, any other missing or extra key is reported, and the callers turn
that into their one-line errors."""

import pytest
from safetensors.torch import save_file

from yxanul.checkpoint.io import load_tolerant
from yxanul.errors import UserError
from yxanul.models import YxanulForCausalLM
from yxanul.models.build import load_weights


def test_only_an_aliased_tied_head_is_forgiven(tiny_config):
    tied = YxanulForCausalLM(tiny_config())
    state = {k: v.clone() for k, v in tied.state_dict().items() if k != "lm_head.weight"}
    assert load_tolerant(tied, state) == ([], [])  # the head IS the embedding: nothing missing

    untied = YxanulForCausalLM(tiny_config(tie_word_embeddings=False))
    state = {k: v.clone() for k, v in untied.state_dict().items() if k != "lm_head.weight"}
    assert load_tolerant(untied, state) == (["lm_head.weight"], [])

    state = {k: v.clone() for k, v in tied.state_dict().items() if k != "model.norm.weight"}
    state["model.extra.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = load_tolerant(tied, state)
    assert missing == ["model.norm.weight"] and unexpected == ["model.extra.weight"]


def test_init_from_a_folder_missing_a_weight_is_one_line(tiny_config, tmp_path):
    model = YxanulForCausalLM(tiny_config())
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()
             if k not in ("lm_head.weight", "model.layers.0.self_attention.proj.weight")}
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"weights do not match the model \(missing \['model\.layers\.0\."):
        load_weights(YxanulForCausalLM(tiny_config()), str(tmp_path))
