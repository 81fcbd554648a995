"""Offline real data: glyphs rendered from installed fonts, Open Clip Art, Fashion-MNIST, your own images (an
ImageFolder tree or a CSV table of files) and PML's CUB / Cars196 / SOP classes, all with class-disjoint splits.
Nothing downloads."""

from .cached_feature_dataset import CachedFeatureDataset
from .class_disjoint_dataset import ClassDisjointDataset, mlrc_class_splits, select_split_classes
from .coupled_augmentation_dataset import CoupledAugmentationDataset
from .fashion_mnist import FashionMNIST
from .feature_cache import FeatureCache
from .get_dataset import DATASET_NAMES, get_dataset
from .glyph_dataset import GlyphDataset
from .image_csv_split import ImageCSVSplit
from .image_files import ImageFileDataset, find_unreadable_images
from .image_folder_split import ImageFolderSplit
from .normalization import IMAGENET_MEAN, IMAGENET_STD
from .open_clip_art import OpenClipArt
from .seeded_view_dataset import SeededViewDataset, draw_view, seeded_view

__all__ = [
    "CachedFeatureDataset",
    "ClassDisjointDataset",
    "CoupledAugmentationDataset",
    "DATASET_NAMES",
    "FashionMNIST",
    "FeatureCache",
    "GlyphDataset",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageCSVSplit",
    "ImageFileDataset",
    "ImageFolderSplit",
    "OpenClipArt",
    "SeededViewDataset",
    "draw_view",
    "find_unreadable_images",
    "get_dataset",
    "mlrc_class_splits",
    "seeded_view",
    "select_split_classes",
]
