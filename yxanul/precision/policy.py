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
