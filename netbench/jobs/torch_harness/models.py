"""The models of a torch job, built to match the TensorFlow ones (netbench.jobs.harness.models)
layer for layer, so both frameworks train the same number of parameters on the same shapes.

* mlp: Flatten, Dense 512 relu, Dense 512 relu, Dense classes (669,706 parameters on 784 inputs);
* cnn: Conv 32, Conv 32, MaxPool, Conv 64, MaxPool (3x3 convolutions, "same" padding, relu),
  Flatten, Dense 128 relu, Dense classes;
* resnet18: the CIFAR variant (3x3 stem, no max-pooling), basic blocks of 64/128/256/512
  filters, 1x1 projection shortcuts where the shape changes, global average pooling.

Keras counts a BatchNormalization layer's moving mean and variance among its weights, so
`model_size` counts torch's floating-point buffers (running_mean, running_var) beside the
parameters; ``num_batches_tracked`` (an integer counter Keras does not keep) is left out.
BatchNorm takes Keras's defaults (epsilon 1e-3, momentum 0.99, i.e. torch momentum 0.01).
Inputs arrive channels-last (N, H, W, C), as the data readers give them; convolutional
models permute them to torch's channels-first on the way in.

Imports torch: only a torch worker process imports this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from netbench.jobs.harness.models import check_input

_BN = {"eps": 1e-3, "momentum": 0.01}  # Keras's BatchNormalization defaults


class _ChannelsFirst(nn.Module):
    """NHWC in, NCHW out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 3, 1, 2).contiguous()


def _conv(cin: int, cout: int, stride: int = 1, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)


class _Block(nn.Module):
    """A basic residual block: two 3x3 convolutions with batch norm, a projection shortcut
    when the stride or the channel count changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv(cin, cout, stride, bias=False), nn.BatchNorm2d(cout, **_BN), nn.ReLU(),
                                  _conv(cout, cout, bias=False), nn.BatchNorm2d(cout, **_BN))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout, **_BN))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def _resnet18(channels: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = [_ChannelsFirst(), _conv(channels, 64, bias=False), nn.BatchNorm2d(64, **_BN), nn.ReLU()]
    cin = 64
    for stage, filters in enumerate((64, 128, 256, 512)):
        layers += [_Block(cin, filters, 1 if stage == 0 else 2), _Block(filters, filters, 1)]
        cin = filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def build_model(name: str, input_shape: tuple[int, ...], classes: int) -> nn.Module:
    """The named model (torch.manual_seed first for the same weights on every rank)."""
    check_input(name, input_shape, classes)
    if name == "mlp":
        features = 1
        for dim in input_shape:
            features *= dim
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, classes))
    height, width, channels = input_shape
    if name == "cnn":
        flat = 64 * (height // 2 // 2) * (width // 2 // 2)
        return nn.Sequential(_ChannelsFirst(), _conv(channels, 32), nn.ReLU(), _conv(32, 32), nn.ReLU(),
                             nn.MaxPool2d(2), _conv(32, 64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, classes))
    if name == "resnet18":
        return _resnet18(channels, classes)
    raise ValueError(f"model {name} is not built for torch")


def model_size(model: Any) -> tuple[int, int]:
    """(parameter count, bytes) of the parameters and floating-point buffers, as Keras counts
    a model's weights."""
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)
