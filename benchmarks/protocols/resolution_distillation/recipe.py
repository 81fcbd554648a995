"""The resolution-distillation recipe as ``{ClassName: kwargs}`` specs, built by the runner's one Builder.

Source: P. Suma and G. Tolias, "Large-to-small Image Resolution Asymmetry in Deep Metric Learning", WACV 2023,
Sec. 4-5, and the paper code (``pavelsuma/raml``): the teacher is trained with a triplet loss (margin 0.7 on squared
L2 of normalised embeddings) and distance-weighted negatives (``cutoff=0.5``, ``nonzero_loss_cutoff=1.4``), batches of
``teacher_classes_per_batch`` classes x 4 images; teachers and students use AdamW (weight decay 1e-6) with GeM's
``p`` at 10x the learning rate and no decay, students a one-cycle schedule (``div_factor=10``); evaluation images
are resized to ``size * 8/7`` and centre-cropped to ``size``. The network is the config's ``models`` (shipped:
ImageNet MobileNetV2 + :class:`pml_extensions.trunks.RetrievalHead`). Every object the protocol trains or evaluates
is one of these specs passed through :class:`pml_extensions.runner.objects.builder.Builder`; the functions at the end
build the common ones for tools and tests.

Example::

    >>> from PIL import Image
    >>> tuple(eval_transform(24)(Image.new("RGB", (50, 30))).shape)
    (3, 24, 24)
"""

import copy
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

from pml_extensions.datasets.normalization import IMAGENET_MEAN, IMAGENET_STD
from pml_extensions.runner.objects.builder import Builder

from .evaluation import METRICS

#: student variants (Tables 3-4); "full" is the paper's student and the baseline of every comparison
STUDENT_VARIANTS: Dict[str, dict] = {
    "full": {},
    "loss_abs_only": {"loss": {"lambda_abs": 1.0, "lambda_ts": 0.0, "lambda_ss": 0.0}},
    "loss_rel_ts_only": {"loss": {"lambda_abs": 0.0, "lambda_ts": 1.0, "lambda_ss": 0.0}},
    "loss_rel_ss_only": {"loss": {"lambda_abs": 0.0, "lambda_ts": 0.0, "lambda_ss": 1.0}},
    "augment_uncoupled": {"augment": {"coupled": False}},
    "augment_no_geometric": {"augment": {"scale": (1.0, 1.0), "ratio": (1.0, 1.0), "flip_p": 0.0}},
    "augment_no_colour": {"augment": {"jitter_strength": 0.0}},
    "augment_no_mixup": {"augment": {"mixup_alpha": None}},
    "init_imagenet": {"init": "imagenet"},
    "init_low_resolution_teacher": {"init": "low_resolution_teacher"},
}
#: dataset names of ``datasets`` (``cub`` / ``cars196`` / ``sop`` / ``imagefolder`` read ``root``)
DATASETS = ("openclipart", "glyphs", "cub", "cars196", "sop", "imagefolder")
IMAGENET = {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}
TEACHER_LOSS = {"metric_loss": {"TripletMarginLoss": {"margin": 0.7, "distance": {"LpDistance": {"power": 2}}}}}
TEACHER_MINER = {"tuple_miner": {"DistanceWeightedMiner": {"cutoff": 0.5, "nonzero_loss_cutoff": 1.4}}}
IMAGES_PER_CLASS = 4
WEIGHT_DECAY = 1e-6
GEM_LR_MULTIPLIER = 10.0


def resolution_models(embedding_dim: int = 512) -> Dict[str, Any]:
    """The protocol's network as a ``models`` spec: ImageNet MobileNetV2 features (read offline) and RAML's GeM +
    whitening :class:`pml_extensions.trunks.RetrievalHead` of ``embedding_dim`` (Suma & Tolias, WACV 2023, Sec. 5;
    MobileNetV2 instead of the paper's ResNet50).

    Example::

        >>> resolution_models(16)["embedder"]
        {'RetrievalHead': {'in_channels': 1280, 'out_dim': 16}}
    """
    return {
        "trunk": {"mobilenet_v2_features": {"pretrained": True}},
        "embedder": {"RetrievalHead": {"in_channels": 1280, "out_dim": embedding_dim}},
    }


def dataset_spec(name: str, settings: Dict[str, Any]) -> Dict[str, Any]:
    """The dataset ``name`` of ``datasets`` as a dataset by name (:func:`pml_extensions.datasets.get_dataset`):
    ``openclipart`` (``max_classes`` 40, ``max_side`` 128), ``glyphs`` (``image_size`` 64, ``source`` matplotlib),
    or PML's / an image folder with ``root``.

    Raises:
        ValueError: an unknown name.
    """
    if name == "openclipart":
        return {
            "name": name,
            "kwargs": {"max_classes": settings.get("max_classes", 40), "max_side": settings.get("max_side", 128)},
        }
    if name == "glyphs":
        return {
            "name": name,
            "kwargs": {"image_size": settings.get("image_size", 64), "source": settings.get("source", "matplotlib")},
        }
    if name in ("cub", "cars196", "sop", "imagefolder"):
        return {"name": name, "root": settings.get("root")}
    raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(repr(d) for d in DATASETS)}")


def eval_transform_spec(size: int) -> Dict[str, Any]:
    """The paper code's evaluation transform: shorter side to ``size·8/7``, centre crop ``size``, ImageNet
    normalisation."""
    return {
        "Compose": {
            "transforms": [
                {"Resize": {"size": int(round(size * 8 / 7))}},
                {"CenterCrop": {"size": size}},
                {"ToTensor": None},
                {"Normalize": dict(IMAGENET)},
            ]
        }
    }


def train_transform_spec(size: int, crop_scale: Sequence[float] = (0.08, 1.0)) -> Dict[str, Any]:
    """The teachers' training transform: RandomResizedCrop(size, crop_scale), horizontal flip, ImageNet
    normalisation (global torch RNG: the protocol reseeds it per chunk)."""
    return {
        "Compose": {
            "transforms": [
                {"RandomResizedCrop": {"size": size, "scale": tuple(crop_scale)}},
                {"RandomHorizontalFlip": None},
                {"ToTensor": None},
                {"Normalize": dict(IMAGENET)},
            ]
        }
    }


def teacher_sampler_spec(num_items: int) -> Dict[str, Any]:
    """``MPerClassSampler`` with 4 images per class and one pass over the training images per iterator."""
    return {"MPerClassSampler": {"m": IMAGES_PER_CLASS, "length_before_new_iter": int(num_items)}}


def optimizer_specs(lr: float, names: Iterable[str] = ("trunk", "embedder")) -> Dict[str, Any]:
    """AdamW (``lr``, weight decay 1e-6) per model, GeM's ``p`` in a group of its own (``lr`` x 10, no decay)."""
    return {
        f"{name}_optimizer": {
            "AdamW": {
                "lr": lr,
                "weight_decay": WEIGHT_DECAY,
                "param_groups": [{"modules": "GeMPooling", "lr_multiplier": GEM_LR_MULTIPLIER, "weight_decay": 0.0}],
            }
        }
        for name in names
    }


def scheduler_specs(optimizer_names: Iterable[str], total_steps: int) -> Dict[str, Any]:
    """A one-cycle schedule over ``total_steps`` iterations per optimizer (``div_factor=10``; ``max_lr`` = the
    optimizer's learning rates)."""
    return {
        f"{name[: -len('_optimizer')]}_scheduler_by_iteration": {
            "OneCycleLR": {"total_steps": int(total_steps), "div_factor": 10.0}
        }
        for name in optimizer_names
    }


def tester_spec(batch_size: int, num_workers: int) -> Dict[str, Any]:
    """The asymmetric tester (rank-local: under torchrun each rank evaluates its own units' models) computing
    :data:`benchmarks.protocols.resolution_distillation.evaluation.METRICS`."""
    return {
        "AsymmetricTester": {
            "batch_size": batch_size,
            "dataloader_num_workers": num_workers,
            "distributed": False,
            "accuracy_calculator": {"AsymmetricAccuracyCalculator": {"include": list(METRICS)}},
        }
    }


def with_pretrained(models: Dict[str, Any], pretrained: bool) -> Dict[str, Any]:
    """``models`` with the trunk's ``pretrained`` argument set (when its spec has one): the teachers and the
    ImageNet-initialised student start from ImageNet, the other students are overwritten by a teacher anyway."""
    out = copy.deepcopy(models)
    trunk = out.get("trunk")
    if isinstance(trunk, dict) and len(trunk) == 1:
        ((name, kwargs),) = trunk.items()
        if isinstance(kwargs, dict) and "pretrained" in kwargs:
            out["trunk"] = {name: dict(kwargs, pretrained=pretrained)}
    return out


# ------------------------------------------------------------------------------------------- built (tools, tests)
def load_dataset(name: str, settings: Dict[str, Any], builder: Optional[Builder] = None) -> Tuple[Any, Any]:
    """``(train, test)`` PIL datasets of ``name`` with class-disjoint splits (nothing is downloaded).

    Raises:
        ValueError: an unknown name. FileNotFoundError (:class:`pml_extensions.runner.errors.MissingDataError`):
        missing data.
    """
    builder = builder or Builder({})
    spec = dataset_spec(name, settings)
    key = f"datasets.{name}"
    return builder.build_dataset("train", spec=spec, key=key), builder.build_dataset("test", spec=spec, key=key)


def eval_transform(size: int, builder: Optional[Builder] = None):
    """:func:`eval_transform_spec` built."""
    return (builder or Builder({})).build_transform(spec=eval_transform_spec(size))


def train_transform(size: int, crop_scale: Sequence[float] = (0.08, 1.0), builder: Optional[Builder] = None):
    """:func:`train_transform_spec` built."""
    return (builder or Builder({})).build_transform(spec=train_transform_spec(size, crop_scale))


def build_model(embedding_dim: int = 512, pretrained: bool = True, builder: Optional[Builder] = None):
    """``(trunk, embedder)`` of the shipped network (:func:`resolution_models`)
    with ``embedding_dim`` outputs; the embedder is initialised from the global RNG."""
    models = (builder or Builder({})).build_models(spec=with_pretrained(resolution_models(embedding_dim), pretrained))
    return models["trunk"], models["embedder"]


def cap_per_class(labels, max_per_class: Optional[int], seed: int = 0) -> np.ndarray:
    """Indices keeping at most ``max_per_class`` items of each label (a seeded draw, sorted); all when None."""
    labels = np.asarray(labels)
    if max_per_class is None:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(labels == label) for label in np.unique(labels)]
    keep = [g if len(g) <= max_per_class else rng.choice(g, max_per_class, replace=False) for g in groups]
    return np.sort(np.concatenate(keep))
