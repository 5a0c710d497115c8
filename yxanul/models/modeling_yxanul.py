"""`YxanulForCausalLM`: a Llama-style decoder whose modules are shaped like Transformer Engine's.

The decoder blocks come from ``modeling_torch.py`` (plain PyTorch twins with TE's module tree and
state-dict names) or ``modeling_te.py`` (Transformer Engine, imported only when chosen); a checkpoint
moves between backends with no renaming. This file never imports TE. The loss is ``loss.py``;
generation is transformers' ``GenerationMixin`` with a ``DynamicCache``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, AutoModelForCausalLM, DynamicCache, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .. import _te
from .._te import parallel_cross_entropy
from ..errors import ConfigError
from . import loss as losses
from .configuration_yxanul import BACKENDS, YxanulConfig
from .masking import packed_documents, padding_causal_mask, padding_in, position_ids_from_mask
from .modeling_torch import RMSNorm, YxanulDecoderLayer, apply_rotary  # noqa: F401 (apply_rotary: re-exported)
from .state_dict import drop_extra_state, forgive_missing_extra_state

# transformers 5.24 names the KV cache `cache` (outputs and generate's kwargs); 5.17 (the GPU image)
# `past_key_values`. forward accepts both and answers under the name this transformers reads back.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

# PEFT LoRA on the native model: the projections are weights of fused modules (Transformer Engine's layout: q/k/v
# beside the norm, gate|up as one fc1_weight), not nn.Linears, so LoRA targets the parameters (PEFT >= 0.17):
# `LoraConfig(target_modules=[], target_parameters=LORA_TARGET_PARAMETERS)`. Same names on both backends.
LORA_TARGET_PARAMETERS = ["query_weight", "key_weight", "value_weight", "self_attention.proj.weight", "fc1_weight",
                          "fc2_weight"]


@dataclass
class YxanulCausalLMOutput(CausalLMOutputWithPast):
    """``loss`` = ``lm_loss`` + ``penalty`` (the weighted penalty; 0 for penalty_type "none").
    Validation and checkpoint selection use ``lm_loss`` so runs with different λ compare."""

    lm_loss: torch.Tensor | None = None
    penalty: torch.Tensor | None = None


def resolve_backend(requested: str) -> str:
    """'auto' -> 'te' when Transformer Engine imports and a CUDA device is present, else 'torch'."""
    if requested not in BACKENDS:
        raise ConfigError("backend", "one of " + ", ".join(BACKENDS), requested)
    if requested != "auto":
        return requested
    return "te" if _te.TE_AVAILABLE and torch.cuda.is_available() else "torch"


class YxanulRotaryEmbedding(nn.Module):
    """``forward(seq_len)`` -> ``[T, 1, 1, head_dim]`` = cat(f, f), exactly ``te.RotaryPositionEmbedding``'s
    output, for both backends. ``inv_freq`` is a non-persistent fp32 buffer (never in a checkpoint);
    if a cast (``model.to(bf16)``, DeepSpeed) lowered its precision it is recomputed in fp32."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.compute_inv_freq(), persistent=False)

    def compute_inv_freq(self, device=None) -> torch.Tensor:
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        return 1.0 / (self.theta ** exponent)  # (hd/2,)

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:
            inv_freq = self.compute_inv_freq(inv_freq.device)
        t = torch.arange(offset, offset + seq_len, device=inv_freq.device, dtype=torch.float32)
        f = t[:, None] * inv_freq[None, :]                     # (T, hd/2); elementwise: immune to autocast
        return torch.cat((f, f), dim=-1)[:, None, None, :]     # [T, 1, 1, hd]

    def for_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) explicit positions -> (B, T, hd) (the torch backend's per-sequence layout)."""
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:
            inv_freq = self.compute_inv_freq(inv_freq.device)
        f = position_ids.to(inv_freq.device, torch.float32)[..., None] * inv_freq   # (B, T, hd/2)
        return torch.cat((f, f), dim=-1)                                             # (B, T, hd)


class YxanulPreTrainedModel(PreTrainedModel):
    config_class = YxanulConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["YxanulDecoderLayer", "TEDecoderLayer"]
    _supports_sdpa = True  # the torch backend's attention IS F.scaled_dot_product_attention (checked in YxanulModel)
    # TE's FP8 state: present in TE checkpoints, absent in torch ones; never an error either way.
    _keys_to_ignore_on_load_unexpected = [r"_extra_state$"]
    _keys_to_ignore_on_load_missing = [r"_extra_state$"]

    def set_activation_checkpointing(self, on: bool) -> None:
        """Recompute each block in backward (non-reentrant) or stop doing so. transformers 5.23
        renamed gradient_checkpointing_* to activation_checkpointing_* (the old name warns); earlier
        5.x releases (5.17 on the GPU image) only have the old one."""
        if on:
            if hasattr(self, "activation_checkpointing_enable"):
                self.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            getattr(self, "activation_checkpointing_disable", self.gradient_checkpointing_disable)()

    @property
    def activation_checkpointing(self) -> bool:
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())

    def create_masks_for_generate(self, attention_mask=None, **kwargs):
        """generate() with a compileable cache (``cache_implementation="static"``) asks the model to turn the
        (B, past + T) padding mask into the 4D masks of transformers' attention layers. This model's forward
        builds its own from the 2D one (masking.py), so it gets that mask as it is."""
        return attention_mask

    @torch.no_grad()
    def _init_weights(self, module):
        """Explicit init by parameter name. transformers' default matches class names containing
        'LayerNorm' and would fill TE's LayerNormLinear QKV matrix with ones. ``init.*`` skip
        tensors already loaded by from_pretrained."""
        std = self.config.initializer_range
        out_std = std / math.sqrt(2 * self.config.num_hidden_layers)  # GPT-2 residual scaling
        if isinstance(module, YxanulRotaryEmbedding):
            init.copy_(module.inv_freq, module.compute_inv_freq(module.inv_freq.device))
        residual_proj = getattr(module, "_is_residual_proj", False)
        for name, p in module.named_parameters(recurse=False):
            if _te.is_quantized(p):  # an FP8 weight (fp8_weight_all_gather): TE drew it from the same
                continue             # init_methods and keeps the fp32 draw for the optimizer's master
            if p.dim() == 1:                                   # RMSNorm weights (there are no biases)
                init.ones_(p)
            elif name == "fc2_weight" or residual_proj:        # layers writing into the residual stream
                init.normal_(p, mean=0.0, std=out_std)
            else:                                              # q/k/v, fc1, embeddings, LM head
                init.normal_(p, mean=0.0, std=std)


class YxanulModel(YxanulPreTrainedModel):
    """Embedding -> decoder blocks (torch or TE) -> final RMSNorm. Returns hidden states (B, T, C)."""

    def __init__(self, config: YxanulConfig):
        super().__init__(config)
        config.backend = resolve_backend(config.backend)
        attn = getattr(config, "_attn_implementation", None)
        if attn not in (None, "sdpa", "eager"):  # torch: SDPA or q k^T softmax; TE: its DotProductAttention
            raise ConfigError("attn_implementation", "'sdpa' or 'eager' (the attentions yxanul implements)", attn)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.backend == "te":
            try:
                from .modeling_te import TEDecoderLayer, te_rmsnorm  # TE: the te backend only
            except ImportError as e:
                raise ConfigError("backend", f"'auto' or 'torch' here (Transformer Engine unusable: {e}; a TE-trained "
                                  "model loads with from_pretrained(..., backend='torch'))", "te") from e
            if not torch.cuda.is_available():  # TE modules raise "TransformerEngine needs CUDA." otherwise
                raise ConfigError("backend", "'auto' or 'torch' here (Transformer Engine layers need a CUDA device; a "
                                  "TE-trained model loads with from_pretrained(..., backend='torch'))", "te")
            self.layers = nn.ModuleList(TEDecoderLayer(config, i) for i in range(config.num_hidden_layers))
            self.norm = te_rmsnorm(config.hidden_size, config.rms_norm_eps)
        else:
            self.layers = nn.ModuleList(YxanulDecoderLayer(config, i) for i in range(config.num_hidden_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.register_load_state_dict_pre_hook(drop_extra_state)
        self.register_load_state_dict_post_hook(forgive_missing_extra_state)
        for layer in self.layers:
            layer.self_attention.proj._is_residual_proj = True
        self.rotary_emb = YxanulRotaryEmbedding(config.head_dim, config.rope_theta)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                use_cache=None, output_hidden_states=None, return_dict=None, is_first_microbatch=None, cache=None,
                **kwargs) -> BaseModelOutputWithPast:
        """transformers' decoder interface -> ``last_hidden_state`` (B, T, C) (+ the cache, + ``hidden_states``:
        the embeddings, each block's output, the last one after the final norm, as Llama's).

        ``attention_mask`` (B, past + T) of 1/0: with padding, attention is causal AND never to a pad key,
        and the positions count from each sequence's first real token (unless ``position_ids`` are given);
        without padding it is dropped and the causal kernel runs as in training (``masking.py``).
        ``cache`` (``past_key_values``): transformers' KV cache, torch backend; new tokens continue its
        positions. ``is_first_microbatch`` goes to TE's blocks (FP8 weight caching)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if kwargs.get("output_attentions") or (kwargs.get("output_attentions") is None and
                                                 self.config.output_attentions):
            raise ValueError("output_attentions: false (yxanul's attention runs fused and keeps no weights; the "
                             "Llama export of this model returns them: docs/export.md)")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        cache = cache if cache is not None else past_key_values
        if self.gradient_checkpointing and self.training:
            cache = None  # recomputation in backward would append the keys twice (as transformers' layers do)
        elif use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if cache is not None and self.config.backend == "te":
            raise ConfigError("backend", "'torch' for a KV cache (generate() on a TE model runs on its torch "
                              "twin with the same weights)", "te")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        T = x.shape[1]
        mask = packed_documents(position_ids) if cache is None else None      # (B, 1, T, T): packed rows
        if padding_in(attention_mask):
            padded = padding_causal_mask(attention_mask, T)                    # (B, 1, T, S) bool
            mask = padded if mask is None else mask & padded
            if position_ids is None and self.config.backend == "torch":        # TE: see rotary_for
                position_ids = position_ids_from_mask(attention_mask, T)
        freqs = self.rotary_for(T, cache, position_ids)
        hidden = [] if output_hidden_states else None
        for layer in self.layers:
            if hidden is not None:
                hidden.append(x)
            x = self.run_layer(layer, x, freqs, is_first_microbatch, cache, mask)
        x = self.norm(x)                                                       # (B, T, C)
        if hidden is not None:
            hidden.append(x)
        out = BaseModelOutputWithPast(last_hidden_state=x, hidden_states=tuple(hidden) if hidden else None,
                                      **{_CACHE_FIELD: cache})
        return out if return_dict is not False else out.to_tuple()

    def rotary_for(self, T, cache, position_ids):
        """[T, 1, 1, hd] from the cache's length, or (B, T, hd) for explicit positions (torch backend).
        TE's blocks take one [T, 1, 1, hd] table for the batch: with padding they keep 0..T-1, which RoPE
        makes equivalent (attention scores depend only on the distance between query and key)."""
        if position_ids is None:
            return self.rotary_emb(T, int(cache.get_seq_length()) if cache is not None else 0)
        if self.config.backend == "te":
            raise ConfigError("position_ids", "None on the TE backend (one RoPE table per batch; pass "
                              "attention_mask for padding)", "a tensor")
        return self.rotary_emb.for_positions(position_ids)

    def run_layer(self, layer, x, freqs, is_first_microbatch, cache, mask):
        if self.gradient_checkpointing and self.training and not isinstance(layer, GradientCheckpointingLayer):
            from .modeling_te import checkpointed_forward  # TE: the te backend only

            return checkpointed_forward(layer, x, freqs, is_first_microbatch, mask)
        kw = {} if mask is None else {"attention_mask": mask}  # no mask: the blocks' calls are unchanged
        if cache is not None:
            kw["cache"] = cache
        return layer(x, freqs, is_first_microbatch=is_first_microbatch, **kw)


class LMHead(nn.Module):
    """The output projection. Deliberately not an ``nn.Linear``: accelerate's FP8 ``convert_model``
    swaps every ``nn.Linear`` for ``te.Linear``, which breaks the tie with the embedding and drops the
    new weight from the optimizer (docs/fp8.md). The LM head stays in BF16 and keeps training."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.register_parameter("bias", None)  # nn.Linear's attributes: TRL's fused log-prob head reads both

    def forward(self, x):
        return F.linear(x, self.weight)


class YxanulForCausalLM(YxanulPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # target: source (transformers 5)

    def __init__(self, config: YxanulConfig):
        super().__init__(config)
        if config.loss_impl == "te":
            if _te.parallel_cross_entropy is None or not torch.cuda.is_available():
                raise ConfigError("loss_impl", "'default' or 'chunked' here ('te' needs Transformer Engine's "
                                  "parallel_cross_entropy and a CUDA device)", "te")
        self.model = YxanulModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def _get_resized_lm_head(self, old_lm_head, new_num_tokens=None, transposed=False, mean_resizing=True):
        """``resize_token_embeddings`` of an untied model: transformers resizes an ``nn.Linear`` only, so the
        head goes through one (no copy: the same weight) and comes back as an `LMHead`."""
        if new_num_tokens is None:
            return old_lm_head
        linear = nn.Linear(old_lm_head.in_features, old_lm_head.out_features, bias=False, device="meta")
        linear.weight = old_lm_head.weight
        new = super()._get_resized_lm_head(linear, new_num_tokens, transposed, mean_resizing)
        with torch.device("meta"):
            head = LMHead(new.in_features, new.out_features)
        head.weight = new.weight
        return head

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, output_hidden_states=None, return_dict=None, logits_to_keep=0,
                is_first_microbatch=None, return_logits=True, num_items_in_batch=None, cache=None,
                **kwargs) -> YxanulCausalLMOutput:
        """transformers' causal-LM interface (``YxanulModel.forward`` for the mask, positions and cache).
        ``labels``: HF-style (position t predicts labels[t+1], shifted here); ``shift_labels`` (a keyword, as
        Llama's loss kwargs: transformers' Trainer takes every forward argument named like ``*labels`` as a label
        its evaluation needs in EVERY batch, and a collator's batches have ``labels`` only): targets already
        aligned with the inputs (the loader's y); ignore_index -100. ``num_items_in_batch``
        (transformers' Trainer under gradient accumulation): the loss is the sum over targets divided by it
        instead of the mean. ``logits_to_keep`` = k > 0: logits of the last k positions only (generate asks
        for 1). ``return_logits=False`` (training/eval steps): no (B, T, V) logits in the output, which
        accelerate's prepared forward would copy to fp32 (`convert_outputs_to_fp32`). ``cache`` is
        ``past_key_values``' name on transformers 5.24 (both work)."""
        base = self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, use_cache=use_cache, output_hidden_states=output_hidden_states,
                          output_attentions=kwargs.pop("output_attentions", None),
                          is_first_microbatch=is_first_microbatch,
                          cache=cache if cache is not None else past_key_values)
        h = base.last_hidden_state                                                     # (B, T, C)
        shift_labels = kwargs.pop("shift_labels", None)
        if labels is not None and shift_labels is None:
            shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)                   # (B, T), last has no target
        chunked = shift_labels is not None and self.config.loss_impl == "chunked"
        logits = None
        if return_logits or not chunked:
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep  # 0: all
            logits = self.lm_head(h[:, keep])                                          # (B, T', V)
        # the losses in the constructor: a ModelOutput's tuple holds its fields in the order they were set, and
        # `return_dict=False` callers take [0] as the loss when labels were given (as Llama's tuple has it)
        loss = self._loss(h, logits, shift_labels, num_items_in_batch) if shift_labels is not None else (None,) * 3
        out = YxanulCausalLMOutput(loss=loss[0], logits=logits if return_logits else None,
                                   hidden_states=base.hidden_states, lm_loss=loss[1], penalty=loss[2],
                                   **{_CACHE_FIELD: getattr(base, _CACHE_FIELD)})
        return out if return_dict is not False else out.to_tuple()

    def _loss(self, h, logits, shift_labels, num_items_in_batch):
        """(loss, lm_loss, penalty) by ``config.loss_impl`` and ``config.penalty_type`` (loss.py)."""
        c = self.config
        pen = dict(penalty_type=c.penalty_type, penalty_weight=c.penalty_weight, num_items_in_batch=num_items_in_batch)
        if c.loss_impl == "chunked":
            return losses.chunked_loss(h, self.lm_head.weight, shift_labels, **pen)
        if c.loss_impl == "te":
            return losses.te_loss(logits, shift_labels, parallel_cross_entropy, **pen)
        if c.penalty_type != "none":
            return losses.loss_from_logits(logits, shift_labels, **pen)
        # no penalty: transformers' own ForCausalLMLoss, fp32 F.cross_entropy, the numbers yxanul always had
        # (.contiguous(): it .view()s, and the loader's y is a slice of a (B, T+1) window)
        loss = self.loss_function(logits=logits, labels=None, vocab_size=c.vocab_size,
                                  shift_labels=shift_labels.contiguous(), num_items_in_batch=num_items_in_batch)
        return loss, loss, torch.zeros((), device=loss.device)

    def generate(self, *args, **kwargs):
        """transformers' generate with a DynamicCache. TE backend: TE's blocks take no transformers Cache
        (TE's InferenceParams is a different, CUDA-only protocol), so generation runs on the torch twin
        that shares this model's weight tensors (no copy; results as the torch backend would give)."""
        if self.config.backend == "te":
            return torch_twin(self).generate(*args, **kwargs)
        return super().generate(*args, **kwargs)


def torch_twin(model: YxanulForCausalLM) -> YxanulForCausalLM:
    """A torch-backend model whose parameters ARE ``model``'s tensors (state-dict names are equal across
    backends; ``assign=True`` takes the tensors themselves). Built on the meta device: nothing allocated."""
    if model.config.backend == "torch":
        return model
    config = copy.deepcopy(model.config)
    config.backend = "torch"
    with torch.device("meta"):
        twin = YxanulForCausalLM(config)
    missing, _ = twin.load_state_dict(model.state_dict(), strict=False, assign=True)  # TE's _extra_state: dropped
    if missing:
        raise RuntimeError(f"torch twin: the TE model lacks {missing[:3]}")
    twin.tie_weights()  # assign=True gave the head its own Parameter object (same storage): tie it again
    twin.model.rotary_emb = model.model.rotary_emb                       # its non-persistent inv_freq, on device
    twin.generation_config = model.generation_config
    return twin.train(model.training)


AutoModel.register(YxanulConfig, YxanulModel, exist_ok=True)
AutoModelForCausalLM.register(YxanulConfig, YxanulForCausalLM, exist_ok=True)
