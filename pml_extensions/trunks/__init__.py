"""Layers that go into a PML trunk."""

from .conv_net_body import ConvNetBody
from .frozen_prefix import FrozenPrefix
from .gem_pooling import GeMPooling
from .histogram_pooling import HistogramPooling, find_histogram_layers, trunk_body
from .histogram_pooling_swap import pooling_tail, use_histogram_pooling
from .margin_softmax import MarginAugmentedSoftmax, margin_argmax
from .perturbed_maximizer import PerturbedArgmaxFunction, PerturbedMaximizer
from .pretrained import MobileNetV2Features, mobilenet_v2_features, mobilenet_v2_imagenet, mobilenet_v2_weights_path
from .retrieval_head import RetrievalHead, l2n
from .small_resnet import SmallResNet
from .soft_maximizer_swap import bn_relu_sites, bn_relu_thresholds, estimate_eta, estimate_mu, soft_maximizer_swap
from .template_matching_block import TemplateMatchingBlock, same_patch_mean
from .template_matching_inserter import insert_template_matching, template_matching_blocks, template_matching_trunk
from .trunk_split import split_trunk, trunk_stages

__all__ = [
    "ConvNetBody",
    "FrozenPrefix",
    "GeMPooling",
    "HistogramPooling",
    "MarginAugmentedSoftmax",
    "MobileNetV2Features",
    "PerturbedArgmaxFunction",
    "PerturbedMaximizer",
    "RetrievalHead",
    "SmallResNet",
    "TemplateMatchingBlock",
    "bn_relu_sites",
    "bn_relu_thresholds",
    "estimate_eta",
    "estimate_mu",
    "find_histogram_layers",
    "insert_template_matching",
    "l2n",
    "margin_argmax",
    "mobilenet_v2_features",
    "mobilenet_v2_imagenet",
    "mobilenet_v2_weights_path",
    "pooling_tail",
    "same_patch_mean",
    "soft_maximizer_swap",
    "split_trunk",
    "template_matching_blocks",
    "template_matching_trunk",
    "trunk_body",
    "trunk_stages",
    "use_histogram_pooling",
]
