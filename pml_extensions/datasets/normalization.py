"""The ImageNet channel statistics (R, G, B of images scaled to [0, 1]) torchvision's ImageNet weights were trained
with, for ``torchvision.transforms.Normalize``: the one copy every transform, overlay and benchmark uses.

Example:
    >>> import torchvision.transforms as T
    >>> T.Normalize(IMAGENET_MEAN, IMAGENET_STD).mean
    (0.485, 0.456, 0.406)
"""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
