"""Padding masks and the position ids they imply (both backends).

transformers' convention: ``attention_mask`` (B, S) is 1 for a real token and 0 for padding, and covers
the cached tokens plus the new ones (S = past + T). The training path (packed sequences, no mask) never
comes here: a mask without padding is dropped (``padding_in``), so it runs the causal kernel unchanged.
Documents packed into one row by another trainer (TRL's ``packing`` / ``padding_free``: ``position_ids`` that
restart inside a row, no mask) are kept apart by a block-diagonal causal mask (``packed_documents``), as
transformers' Llama does.
"""

from __future__ import annotations

import torch


def padding_in(attention_mask: torch.Tensor | None) -> bool:
    """True when a 2D mask has a 0 anywhere (one host sync; only paid when a mask is given)."""
    if attention_mask is None:
        return False
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask: expected (batch, sequence) of 0/1, got shape {tuple(attention_mask.shape)}")
    return not bool(attention_mask.all())


def position_ids_from_mask(attention_mask: torch.Tensor, T: int) -> torch.Tensor:
    """(B, S) mask -> (B, T) positions of the last T tokens: each sequence counts from 0 at its first real
    token (left padding shifts nothing), pads sit at 0 (as transformers' generation always did)."""
    pos = attention_mask.long().cumsum(-1) - 1            # (B, S)
    return pos.clamp(min=0)[:, -T:]


def padding_causal_mask(attention_mask: torch.Tensor, T: int) -> torch.Tensor:
    """(B, S) padding mask -> (B, 1, T, S) bool, True = may attend: causal with the T queries at the end
    of the S keys, and never to a pad key."""
    S = attention_mask.shape[-1]
    device = attention_mask.device
    causal = torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)    # (T, S)
    return causal[None, None] & attention_mask.bool()[:, None, None, :]       # (B, 1, T, S)


def packed_documents(position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) position ids that restart inside a row -> (B, 1, T, T) bool, True = may attend: causal within a
    document, never across; None when no row restarts (one host sync, paid only when position ids are given).
    transformers' rule (``find_packed_sequence_indices``): a document starts where a position is not its
    predecessor + 1."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return None
    starts = torch.diff(position_ids, dim=-1) != 1                                     # (B, T-1)
    if not bool(starts.any()):
        return None
    doc = torch.nn.functional.pad(starts.long().cumsum(-1), (1, 0))                    # (B, T) document index
    T = position_ids.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=position_ids.device).tril()     # (T, T)
    return causal[None, None] & (doc[:, None, :, None] == doc[:, None, None, :])       # (B, 1, T, T)
