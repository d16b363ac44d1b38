"""Example training tasks: a small CNN on scikit-learn's digits, and ResNet-18 on synthetic data.

A task is named ``module:function``; the function returns a :class:`TrainingTask`. Keyword
options come from the fragment's spec (e.g. ``{"lr": 0.05, "width": 16}``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .trainer import TrainingTask

__all__ = ["digits_cnn", "resnet18_synthetic", "ResNet18"]


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images (N, 8, 8), labels (N,)).

    Read straight from the CSV that ``sklearn.datasets.load_digits`` reads: importing
    ``sklearn.datasets`` takes about 1.4 s here, half of a fragment's start-up, and every
    rescale pays it again.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        csv = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
        if csv.exists():
            table = np.loadtxt(csv, delimiter=",")
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.images, data.target


def _digits(seed: int, holdout: float = 0.2):
    images, labels = _digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(len(x) * (1 - holdout))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions and a linear head for 8×8 digit images (no batch norm, no dropout,
    so results do not depend on how a batch is split across ranks)."""

    def __init__(self, width: int = 16, depth: int = 2, kernel: int = 3) -> None:
        super().__init__()
        layers, channels = [], 1
        for _ in range(depth):
            layers += [nn.Conv2d(channels, width, kernel, padding=kernel // 2), nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def digits_cnn(
    lr: float = 0.05,
    width: int = 16,
    depth: int = 2,
    kernel: int = 3,
    global_batch: int = 64,
    seed: int = 0,
) -> TrainingTask:
    """The example task: classify scikit-learn's 8×8 digits (1,437 training images)."""
    (train, test) = _digits(seed)

    def evaluate(model: nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device  # the rank's: a GPU on GPU nodes
        pred = model(test[0].to(device)).argmax(1).cpu()
        return {
            "accuracy": float((pred == test[1]).float().mean()),
            "params": float(sum(p.numel() for p in model.parameters())),
        }

    return TrainingTask(
        model=lambda: DigitsCNN(width, depth, kernel),
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9),
        dataset=lambda: train,
        loss=lambda out, y: F.cross_entropy(out, y, reduction="none"),
        global_batch=global_batch,
        seed=seed,
        evaluate=evaluate,
    )


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al.): 11.7 M parameters at 1,000 classes."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def resnet18_synthetic(
    samples: int = 256, image: int = 64, global_batch: int = 16, lr: float = 0.01, seed: int = 0
) -> TrainingTask:
    """ResNet-18 on random images (benchmarks: the model's size is what matters)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 3, image, image, generator=g)
    y = torch.randint(0, 1000, (samples,), generator=g)
    return TrainingTask(
        model=ResNet18,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9),
        dataset=lambda: (x, y),
        loss=lambda out, t: F.cross_entropy(out, t, reduction="none"),
        global_batch=global_batch,
        seed=seed,
    )
