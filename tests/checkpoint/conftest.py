"""Fixtures: a tiny model and optimizer prepared by a CPU accelerator, what every checkpoint test saves."""

import pytest
import torch
from accelerate import Accelerator


@pytest.fixture
def acc_model():
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model, opt = acc.prepare(model, opt)
    return acc, model, opt
