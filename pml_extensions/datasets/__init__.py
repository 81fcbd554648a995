"""Offline real data: glyphs rendered from installed fonts, Open Clip Art, Fashion-MNIST, ImageFolder trees and
PML's CUB / Cars196 / SOP classes, all with class-disjoint splits. Nothing downloads."""

from .class_disjoint_dataset import ClassDisjointDataset, select_split_classes
from .coupled_augmentation_dataset import CoupledAugmentationDataset
from .fashion_mnist import FashionMNIST
from .get_dataset import DATASET_NAMES, get_dataset
from .glyph_dataset import GlyphDataset
from .image_folder_split import ImageFolderSplit
from .normalization import IMAGENET_MEAN, IMAGENET_STD
from .open_clip_art import OpenClipArt

__all__ = [
    "ClassDisjointDataset",
    "CoupledAugmentationDataset",
    "DATASET_NAMES",
    "FashionMNIST",
    "GlyphDataset",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageFolderSplit",
    "OpenClipArt",
    "get_dataset",
    "select_split_classes",
]
