"""The environment a `yxanul bench` JSON records, where the device's libraries disagree with torch's."""

import torch

from yxanul.tools import bench_report


def test_a_cudnn_that_torch_refuses_is_written_down_not_raised(monkeypatch):
    """TE loads the image's system libcudnn before torch's pip one; torch's version check then raises. The H200
    lease of 2026-11-28 lost every speed variant to that line: the record must note it and go on."""
    def refuse():
        raise RuntimeError("cuDNN version incompatibility: PyTorch was compiled against (9, 19, 0) but found "
                           "runtime version (9, 14, 0).\nmore")

    monkeypatch.setattr(torch.backends.cudnn, "version", refuse)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    env = bench_report.environment(torch.device("cuda", 0))
    assert env["device_name"] == "NVIDIA H200" and env["compute_capability"] == "9.0"
    torch_says = env["cudnn_torch"]
    assert torch_says.startswith("RuntimeError: cuDNN version incompatibility") and "\n" not in torch_says
    assert "cudnn" in env  # TE's runtime cuDNN (None where TE is not installed)


def test_a_cpu_record_names_no_cuda_libraries():
    env = bench_report.environment(torch.device("cpu"))
    assert env["device"] == "cpu" and "cudnn" not in env and env["torch"] == torch.__version__
