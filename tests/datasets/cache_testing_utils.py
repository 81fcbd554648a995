"""Tiny images, transforms and split models for the feature-cache tests (CPU, seeded, no files unless asked)."""

import os

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

from pml_extensions.trunks import split_trunk


class TinyImages(torch.utils.data.Dataset):
    """``n`` random 12 × 12 RGB PIL images, ``classes`` classes in blocks; ``labels`` int64 [n]."""

    def __init__(self, n=12, classes=3, seed=0, size=12):
        rng = np.random.default_rng(seed)
        self.arrays = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]
        self.labels = np.repeat(np.arange(classes), -(-n // classes))[:n].astype(np.int64)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return Image.fromarray(self.arrays[i]), int(self.labels[i])


class PNGFiles(torch.utils.data.Dataset):
    """PNG files on disk with a ``paths`` list (the file-list part of the cache key)."""

    def __init__(self, paths, labels):
        self.paths, self.labels = list(paths), np.asarray(labels, dtype=np.int64)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as image:
            return image.convert("RGB"), int(self.labels[i])


def write_pngs(folder, n=6, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        path = os.path.join(folder, f"{i:02d}.png")
        Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return PNGFiles(paths, [i % 2 for i in range(n)])


def train_transform(size=8, scale=(0.5, 1.0)):
    return T.Compose([T.RandomResizedCrop(size, scale=scale, antialias=True), T.RandomHorizontalFlip(), T.ToTensor()])


def tiny_model(seed=0, dtype=torch.float32):
    """Conv-BN-ReLU (the prefix, up to module "2") then Conv-BN-ReLU-GAP-Flatten (the rest); BN statistics set so
    eval and train mode differ."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.Conv2d(4, 6, 3, stride=2, padding=1),
            torch.nn.BatchNorm2d(6),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )
        for bn in (model[1], model[4]):
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
    return model.to(dtype)


def tiny_split(seed=0, dtype=torch.float32):
    """``(model, prefix, rest)`` of :func:`tiny_model` split at module "2"."""
    model = tiny_model(seed, dtype)
    prefix, rest = split_trunk(model, "2")
    return model, prefix, rest
