"""Small module factories the frontend tests build by name ('pytorch_test_factories:...')."""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    """conv -> relu -> two heads; enough structure for names, multiple outputs and weights."""

    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, kernel_size=3, padding=1)
        self.head = nn.Linear(channels, 2)

    def forward(self, x):
        features = torch.relu(self.conv(x))
        pooled = features.mean(dim=(2, 3))
        return {"logits": self.head(pooled), "features": features}


class Scaled(nn.Module):
    """Takes a fixed scalar argument, like silero's sample rate."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-1.0, 1.0, 8))

    def forward(self, x, scale: int):
        if scale == 2:
            return torch.tanh(x * self.weight * 2.0)
        return x * self.weight


class Stateful(nn.Module):
    """Keeps a running total between calls (as a streaming RNN keeps its state)."""

    def __init__(self):
        super().__init__()
        self.total = torch.zeros(1, 8)

    def forward(self, x):
        self.total = self.total + x
        return self.total * 2.0


def broken(**kwargs):
    raise RuntimeError("weights server unreachable")


def not_a_module():
    return "a string"
