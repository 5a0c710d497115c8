"""TE backend under a padding mask (GPU + Transformer Engine): the TE blocks take yxanul's (B, 1, T, S)
mask as TE's "arbitrary" mask (True = masked out there) and must give the torch twin's logits on the real
positions of a left-padded batch. fp32 weights, no autocast; TE runs fp32 GEMMs in TF32 (cublaslt_gemm.cu:
"default to tf32"; 10-bit mantissa, unit roundoff 2^-11) and the twin in strict fp32, so the logits differ
by a few TF32 roundoffs (seen on an H200: 7.1e-4 at most): ATOL = 2^-8. An ignored or misread mask moves
them by O(1) (1.55 measured before masks were honoured), 400 times that."""

import pytest
import torch

from yxanul.models import YxanulForCausalLM, config_from_preset
from yxanul.models.modeling_yxanul import torch_twin

pytestmark = [pytest.mark.gpu, pytest.mark.te]
ATOL = 2**-8


def test_te_padding_mask_matches_the_torch_twin():
    torch.manual_seed(0)
    model = YxanulForCausalLM(config_from_preset("nano", 1000, 64, backend="te", num_key_value_heads=2)).cuda().eval()
    twin = torch_twin(model)
    ids = torch.tensor([[999, 999, 999, 5, 17, 300, 42], [64, 900, 3, 11, 12, 13, 14]], device="cuda")
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], device="cuda")
    real = mask.bool()
    with torch.no_grad():
        te_logits = model(ids, attention_mask=mask).logits
        twin_logits = twin(ids, attention_mask=mask).logits
        alone = model(ids[:1, 3:]).logits[0]
    torch.testing.assert_close(te_logits[real], twin_logits[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(te_logits[0, 3:], alone, rtol=0, atol=ATOL)
