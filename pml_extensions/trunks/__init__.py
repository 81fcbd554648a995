"""Layers that go into a PML trunk."""

from .conv_net_body import ConvNetBody
from .gem_pooling import GeMPooling
from .histogram_pooling import HistogramPooling
from .retrieval_head import RetrievalHead, l2n
from .pretrained import MobileNetV2Features, mobilenet_v2_features, mobilenet_v2_weights_path

__all__ = ["ConvNetBody", "GeMPooling", "HistogramPooling", "MobileNetV2Features", "RetrievalHead", "l2n", "mobilenet_v2_features", "mobilenet_v2_weights_path"]
