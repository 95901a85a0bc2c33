"""Built-in non-LM tasks: networks and data for compressing something with a real accuracy.

The data is scikit-learn's `load_digits` (1,797 8x8 grey-scale digits, shipped inside the
package: no download). Two networks:

- `DigitsCNN`: a small convolutional classifier, so static INT8 quantization of
  convolutions is exercised (the role ResNet-50 plays in the seed article);
- `DigitsMLP`: a wide, Linear-heavy residual MLP, where INT8 GEMMs can show real speed-ups
  because the fp32 weights no longer fit in cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

DIGITS_CLASSES = 10
DIGITS_SPLIT_SEED = 0
DIGITS_TEST_FRACTION = 0.2


class DigitsCNN(nn.Module):
    """Two 3x3 conv layers + max-pool + a two-layer classifier head, input [B, 1, 8, 8]."""

    def __init__(self, channels: int = 32, head: int = 128):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc1 = nn.Linear(2 * channels * 4 * 4, head)
        self.fc2 = nn.Linear(head, DIGITS_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class ResidualMLPBlock(nn.Module):
    """x + W2 GELU(W1 x): the transformer FFN shape, without attention."""

    def __init__(self, width: int, ffn: int):
        super().__init__()
        self.up = nn.Linear(width, ffn)
        self.down = nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class DigitsMLP(nn.Module):
    """Linear-heavy classifier on flattened digits: almost all FLOPs and bytes are in GEMMs."""

    def __init__(self, width: int = 1024, ffn: int = 4096, n_blocks: int = 2):
        super().__init__()
        self.stem = nn.Linear(64, width)
        self.blocks = nn.ModuleList(ResidualMLPBlock(width, ffn) for _ in range(n_blocks))
        self.head = nn.Linear(width, DIGITS_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(torch.flatten(x, 1)))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


NETWORKS = {"digits-cnn": DigitsCNN, "digits-mlp": DigitsMLP}


@dataclass
class DigitsData:
    """Train / test split of the digits set as float tensors [N, 1, 8, 8] in [0, 1] and int64 labels."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_digits_data() -> DigitsData:
    """The fixed, stratified 80/20 split used everywhere, so accuracies are comparable across runs."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        torch.arange(len(labels)).numpy(),
        test_size=DIGITS_TEST_FRACTION,
        random_state=DIGITS_SPLIT_SEED,
        stratify=labels.numpy(),
    )
    return DigitsData(images[train_idx], labels[train_idx], images[test_idx], labels[test_idx])


def build_network(task: str, **kwargs) -> nn.Module:
    """The untrained network of a built-in task, from its name and constructor arguments."""
    return NETWORKS[task](**kwargs)


def train_digits(model: nn.Module, data: DigitsData, epochs: int = 20, lr: float = 2e-3, seed: int = 0) -> nn.Module:
    """Quick Adam training on the train split; deterministic for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    n = len(data.train_y)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, 64):
            idx = order[start : start + 64]
            loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.eval()


def digits_accuracy(model, data: DigitsData, batch_size: int = 120) -> float:
    """Top-1 test accuracy. Batches have one fixed size (the tail is padded) so compiled models see one shape."""
    correct = 0
    n = len(data.test_y)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            x = data.test_x[start : start + batch_size]
            real = len(x)
            if real < batch_size:
                x = torch.cat([x, x.new_zeros((batch_size - real, *x.shape[1:]))])
            pred = model(x)[:real].argmax(dim=-1)
            correct += int((pred == data.test_y[start : start + real]).sum())
    return correct / n
