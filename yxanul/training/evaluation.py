"""Validation loss and the generated sample printed at each evaluation."""

from __future__ import annotations

import torch

from .step import forward


def lm_loss_of(out) -> torch.Tensor:
    """The language-model loss of a model output: ``lm_loss`` when the model reports it apart from a
    penalty, else ``loss``. Validation and the best checkpoint use this, so runs with different
    penalties compare."""
    lm = getattr(out, "lm_loss", None)
    return out.loss if lm is None else lm


def evaluate_loss(model, batches, plan, accelerator) -> float:
    """Mean validation LM loss over fixed ``batches`` of (x, y), averaged across processes."""
    model.eval()
    total = torch.zeros((), device=accelerator.device)
    n = 0
    with torch.no_grad():
        for x, y in batches:
            out = forward(model, x.to(accelerator.device), y.to(accelerator.device), plan=plan, training=False,
                          accelerator=accelerator)
            total += lm_loss_of(out).float()
            n += 1
    model.train()
    return accelerator.reduce(total / max(n, 1), "mean").item()


def sample(model, tokenizer, prompt: str, n_tokens: int, device) -> str:
    """Up to ``n_tokens`` sampled after ``prompt`` (top-k 50, temperature 0.8, seed 0) without touching the
    training RNG streams (resume stays exact). Prompt and sample stay within the model's positions, as in
    `yxanul generate`: past them it never trained (and transformers warns at every sample)."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    if ids.numel() == 0:
        ids = torch.tensor([[tokenizer.eos_token_id]], device=device)
    limit = int(model.config.max_position_embeddings)
    ids = ids[:, -(limit - 1):] if ids.shape[1] >= limit > 1 else ids  # a long prompt keeps its end: one new token
    n_tokens = min(n_tokens, limit - ids.shape[1])
    if n_tokens < 1:
        return ""
    was_training = model.training
    model.eval()  # no training-only branches (checkpointing, TE's weight caching) while sampling
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # keep resume exact
        torch.manual_seed(0)
        out = model.generate(ids, max_new_tokens=n_tokens, do_sample=True, top_k=50, temperature=0.8,
                             pad_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
