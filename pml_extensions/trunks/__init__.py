"""Layers that go into a PML trunk."""

from .conv_net_body import ConvNetBody
from .histogram_pooling import HistogramPooling
from .pretrained import MobileNetV2Features, mobilenet_v2_features, mobilenet_v2_weights_path

__all__ = ["ConvNetBody", "HistogramPooling", "MobileNetV2Features", "mobilenet_v2_features", "mobilenet_v2_weights_path"]
