"""The one copy of the ImageNet channel statistics used by every transform, explanation overlay and benchmark.

``IMAGENET_MEAN`` / ``IMAGENET_STD``: per-channel (R, G, B) mean and standard deviation of images scaled to [0, 1],
the normalisation torchvision's ImageNet weights (``IMAGENET1K_V1``, e.g. the offline MobileNetV2) were trained
with; pass them to ``torchvision.transforms.Normalize``.

Example:
    >>> import torchvision.transforms as T
    >>> T.Normalize(IMAGENET_MEAN, IMAGENET_STD).mean
    (0.485, 0.456, 0.406)
"""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
