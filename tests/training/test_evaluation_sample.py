"""The sample printed at each evaluation (training/evaluation.py `sample`)."""

import torch

from yxanul.data.tokenizer_load import load_tokenizer
from yxanul.models import config_from_preset
from yxanul.models.modeling_yxanul import YxanulForCausalLM
from yxanul.training.evaluation import sample


def test_the_sample_stays_within_the_models_positions_and_the_training_rng():
    """At --seq_length 16 a 40-token sample after "ROMEO:" ran past the 16 positions the model has (transformers
    warned at every evaluation): prompt and sample now fill them and stop, a prompt longer than them keeps its
    end, and the training RNG is where it was."""
    _, tok = load_tokenizer(None)
    torch.manual_seed(0)
    model = YxanulForCausalLM(config_from_preset("nano", len(tok), 16, backend="torch"))
    assert model.config.max_position_embeddings == 16
    lengths, generate = [], model.generate

    def spy(*args, **kw):  # the real generate, its output length recorded
        out = generate(*args, **kw)
        lengths.append(out.shape[1])
        return out

    model.generate = spy
    state = torch.get_rng_state()
    assert sample(model, tok, "ROMEO:", 40, torch.device("cpu"))
    assert sample(model, tok, "ROMEO: " * 20, 40, torch.device("cpu"))
    assert lengths == [16, 16] and torch.equal(torch.get_rng_state(), state)
