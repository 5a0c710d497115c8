"""Small-GEMM policy: which TE modules run FP8 and which stay BF16, and why.

Granularity is the TE module, because FP8 is decided per module forward (TE reads the autocast
state in `prepare_forward`): `layernorm_qkv` (LayerNormLinear, the QKV GEMM), `proj` (Linear,
attention output) and `layernorm_mlp` (LayerNormMLP: fc1 and fc2 run inside ONE autograd function,
so they share one decision, reported as kind "mlp" = fc1 + fc2). The LM head is not a TE module
and always stays BF16.

Rule, per kind, for the weight shapes (out, in) of its GEMM(s):
1. every dimension a multiple of the recipe's alignment: 16 (TE's FP8 GEMM requirement,
   `assert_dim_for_fp8_exec`), 32 for MXFP8 (one E8M0 scale per 32 values;
   `get_align_size_for_quantization`), and
2. every dimension >= ``fp8_min_gemm_dim`` (FP8 loses at small widths: docs/fp8.md);
then ``fp8_keep_bf16`` patterns (fnmatch on module names) force single modules to BF16.

The attention runs in FP8 only with ``fp8_attention``, where TE can train it (`fp8_attention_unsupported`).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

KINDS = ("qkv", "proj", "mlp")
_SUFFIX = {".self_attention.layernorm_qkv": "qkv", ".self_attention.proj": "proj", ".layernorm_mlp": "mlp"}
LM_HEAD_WHY = "never FP8 (logits precision; tied to the embedding; not a TE module)"


def fp8_alignment(recipe: str) -> int:
    """Multiple every GEMM dimension (and the tokens of a micro-batch) must have under this recipe."""
    return 32 if recipe == "mxfp8" else 16


def gemm_shapes(config) -> dict[str, list[tuple[int, int]]]:
    """Weight shapes (out, in) of the GEMMs of one block, by kind."""
    h, f = config.hidden_size, config.intermediate_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    return {"qkv": [(q + 2 * kv, h)], "proj": [(h, q)], "mlp": [(2 * f, h), (h, f)]}


def layer_policy(config, args) -> dict[str, tuple[bool, str]]:
    """Per kind: (runs FP8, why). Pure: depends on the config and the threshold only."""
    out: dict[str, tuple[bool, str]] = {}
    align = fp8_alignment(args.fp8_recipe)
    for kind, shapes in gemm_shapes(config).items():
        dims = sorted({d for s in shapes for d in s})
        shown = ", ".join(f"{a}x{b}" for a, b in shapes)
        bad = [d for d in dims if d % align]
        if bad:
            out[kind] = (False, f"GEMM {shown}: {bad[0]} is not a multiple of {align} "
                                f"(TE {args.fp8_recipe} FP8 requirement)")
        elif dims[0] < args.fp8_min_gemm_dim:
            out[kind] = (False, f"GEMM {shown}: smallest dim {dims[0]} < fp8_min_gemm_dim {args.fp8_min_gemm_dim}")
        else:
            out[kind] = (True, f"GEMM {shown}: all dims >= {args.fp8_min_gemm_dim} and multiples of {align}")
    out["lm_head"] = (False, LM_HEAD_WHY)
    return out


def kind_of(name: str) -> str | None:
    for suffix, kind in _SUFFIX.items():
        if name.endswith(suffix):
            return kind
    return None


def policy_modules(model):
    """(name, kind, module) for the modules the policy decides (both backends have these names)."""
    for name, module in model.named_modules():
        kind = kind_of(name)
        if kind is not None:
            yield name, kind, module


def module_decisions(model, policy: dict, keep_bf16: list[str] | None) -> dict[str, tuple[str, bool, str]]:
    """Per module name: (kind, runs FP8, why)."""
    out = {}
    for name, kind, _ in policy_modules(model):
        fp8, why = policy.get(kind, (False, "not in the policy"))
        pattern = next((p for p in keep_bf16 or () if fnmatchcase(name, p)), None)
        if fp8 and pattern is not None:
            fp8, why = False, f"fp8_keep_bf16 pattern {pattern!r}"
        out[name] = (kind, fp8, why)
    return out


def fp8_attention_recipe_unsupported(recipe: str) -> str | None:
    """The part of `fp8_attention_unsupported` that the config alone decides (PrecisionArgs checks it at parse)."""
    if recipe not in ("delayed", "current"):
        return f"with fp8_recipe {recipe} (TE's FP8 attention takes the delayed and current recipes)"
    return None


def fp8_attention_unsupported(recipe: str, head_dim: int, compute_capability: tuple[int, int] | None,
                              device_name: str | None, te_version: str | None) -> str | None:
    """Why TE 2.20 cannot train FP8 attention (``fp8_dpa``) here, as the tail of a "false ..." line (None: it can);
    `check_fp8_attention` refuses a run that asks for it, a speed default is held off. Without this the first
    forward raises "No dot product attention backend is available" (an H200, 2026-11-27). ``get_attention_backend``
    turns FlashAttention 3 and the unfused attention off for FP8 training, and FusedAttention off for current
    scaling below sm_100; what is left is cuDNN's FP8 kernel, which ``nvte_get_fused_attn_backend``
    (common/fused_attn/fused_attn.cpp) picks for training only at head_dim 128 below sm_100 (cuDNN 9.2.1+ and
    9.7+ alike), head_dim <= 128 and a multiple of 16 from sm_100 on. The block and MXFP8 recipes take no fp8_dpa."""
    cc, device = tuple(compute_capability or (0, 0)), device_name or "a machine without CUDA"
    if why := fp8_attention_recipe_unsupported(recipe):
        return why
    if recipe == "current" and cc < (10, 0):
        return (f"with fp8_recipe current on {device} (TE {te_version} has no FP8 attention for current scaling "
                "below compute capability 10.0); or fp8_recipe delayed")
    if (head_dim != 128) if cc < (10, 0) else (head_dim > 128 or head_dim % 16):
        need = "head_dim 128 below compute capability 10.0" if cc < (10, 0) else "head_dim <= 128, a multiple of 16"
        return (f"for head_dim {head_dim} on {device} (cuDNN's FP8 attention, the one TE {te_version} trains with, "
                f"takes {need}: hidden_size / num_attention_heads, e.g. the presets large, xlarge, 3b, 7b)")
    return None
