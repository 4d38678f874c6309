"""MTCNN's PNet and RNet, for the weights shipped in facenet-pytorch 2.6.0 (``data/pnet.pt``, ``rnet.pt``).

A reimplementation of the architectures in ``facenet_pytorch/models/mtcnn.py``: importing that
module pulls in torchvision (for box decoding we do not need), which has no build here. Layer
names and shapes match the package's state_dicts key for key; the weights are loaded by the
frontend, never by these constructors.
"""

from __future__ import annotations

import torch
from torch import nn


class PNet(nn.Module):
    """Proposal net: 12x12 windows -> box regression (N,4,h,w) and face probability (N,2,h,w)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x: torch.Tensor):
        x = self.prelu1(self.conv1(x))
        x = self.pool1(x)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        probabilities = self.softmax4_1(self.conv4_1(x))
        boxes = self.conv4_2(x)
        return boxes, probabilities


class RNet(nn.Module):
    """Refinement net: 24x24 crops -> box regression (N,4) and face probability (N,2)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, kernel_size=3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(28, 48, kernel_size=3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(48, 64, kernel_size=2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.softmax5_1 = nn.Softmax(dim=1)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))
        # The original weights came from Caffe, which flattens in (w, h, c) order.
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu4(self.dense4(x.view(x.shape[0], -1)))
        probabilities = self.softmax5_1(self.dense5_1(x))
        boxes = self.dense5_2(x)
        return boxes, probabilities
