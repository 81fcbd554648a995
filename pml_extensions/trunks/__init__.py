"""Layers that go into a PML trunk."""

from .conv_net_body import ConvNetBody
from .histogram_pooling import HistogramPooling
from .pretrained import mobilenet_v2_features, mobilenet_v2_weights_path

__all__ = ["ConvNetBody", "HistogramPooling", "mobilenet_v2_features", "mobilenet_v2_weights_path"]
