"""Tracking helpers: the GPU peak table behind MFU, FLOPs per token, the fixed console line."""

import pytest

from yxanul.tracking import flops_per_token, format_step_line, peak_flops


@pytest.mark.parametrize("name,key", [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                                      ("NVIDIA H200", "H200"), ("NVIDIA GH200 480GB", "GH200"),
                                      ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"),
                                      ("NVIDIA A100-SXM4-80GB", "A100")])
def test_peak_flops_picks_the_most_specific_gpu_name(name, key):
    assert peak_flops(name)[0] == key


def test_unknown_gpu_and_cpu_have_no_peak():
    assert peak_flops(None) is None and peak_flops("NVIDIA GeForce GTX 1080") is None


def test_flops_per_token_and_step_line():
    assert flops_per_token(124_000_000, 12, 768, 1024) == 6 * 124_000_000 + 12 * 12 * 768 * 1024
    line = format_step_line(250, 0, 3.456789, 6e-4, 0.8234, 156.78, 3345.67, "BF16")
    assert line == ("step  250 | epoch 0 | loss: 3.456789 | lr: 6.00e-04 | norm: 0.8234 | dt: 156.78ms | "
                    "tok/sec: 3345.67 | BF16")
