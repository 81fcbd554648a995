"""A run's inputs for ``explain`` (:mod:`pml_extensions.cli.explain`): its model (a checkpoint, the model a run
selected, or the ImageNet MobileNetV2), image files read as that model's run read them, and a run's own test images
through its eval transform (:class:`RunData`), all through the runner's one path
(:mod:`pml_extensions.runner.objects.saved_models`, the run's ``config.yaml`` and its ``Builder``).
"""

from __future__ import annotations  # annotations name torch types that load only when a command runs

import json
import os
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

#: the side images are resized to when neither ``--image-size`` nor the run's config gives one
DEFAULT_IMAGE_SIZE = 320


def load_models(checkpoint: Optional[str], trust: bool = False):
    """``(trunk, embedder)`` from ``checkpoint`` (see ``--checkpoint`` and
    :mod:`pml_extensions.runner.objects.saved_models`) or the ImageNet MobileNetV2.

    Raises:
        FileNotFoundError: a missing checkpoint; ValueError: an unreadable one (one line naming the file).
    """
    from torch import nn

    from ..runner.objects.saved_models import load_models as _load_models
    from ..trunks.pretrained import mobilenet_v2_features

    def imagenet_mobilenet():
        trunk = nn.Sequential(mobilenet_v2_features(pretrained=True), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return trunk, nn.Identity()

    return _load_models(checkpoint, trust, default=imagenet_mobilenet)


def load_image(path: str, size: int, channels: int = 3, keep_aspect: bool = False, stats=None) -> torch.Tensor:
    """Image file → ``[channels, size, size]`` tensor (resized without cropping, as the authors' demo), or
    with ``keep_aspect`` the shorter side resized to ``size`` (``[channels, size, W']`` or ``[channels, H',
    size]``); normalised with ``stats = (mean, std)`` when given (a run's own eval normalisation), else
    ImageNet-normalised for 3 channels and grey in [0, 1] for 1 channel."""
    from PIL import Image
    from torchvision.transforms import functional as TF

    from ..explain.reference_images import read_image

    im = read_image(path, "RGB" if channels == 3 else "L")  # transparency on white, as the datasets
    if keep_aspect:
        w, h = im.size
        new = (size, max(1, round(h * size / w))) if w <= h else (max(1, round(w * size / h)), size)
    else:
        new = (size, size)
    im = im.resize(new, Image.BILINEAR)
    x = TF.to_tensor(im)
    mean, std = stats if stats is not None else _default_stats(channels)
    return x if mean is None else TF.normalize(x, mean, std)


def _default_stats(channels: int):
    from ..datasets.normalization import IMAGENET_MEAN, IMAGENET_STD

    return (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else (None, None)


def side_of(checkpoint, channels, size):
    """``(size, (mean, std))`` of one side: the run's own preprocessing when ``checkpoint`` is a run's file."""
    from ..runner.objects.saved_models import run_preprocessing

    run = run_preprocessing(checkpoint)
    if run is not None and run["mean"] is not None and len(run["mean"]) == 1 < channels:  # Normalize broadcasts
        run = {**run, "mean": run["mean"] * channels, "std": run["std"] * channels}
    fits = run is not None and (run["mean"] is None or len(run["mean"]) == channels)  # else a config we cannot read
    stats = (run["mean"], run["std"]) if fits else _default_stats(channels)
    return size or (run or {}).get("image_size") or DEFAULT_IMAGE_SIZE, stats


def run_of(checkpoint: str) -> Optional[str]:
    """The experiment folder holding the run config of ``checkpoint`` (None when it is not inside a run)."""
    from ..runner.objects.saved_models import find_run_config

    try:
        _, path = find_run_config(checkpoint)
    except (OSError, ValueError):
        return None
    return os.path.dirname(path) if path else None


def references(args) -> list:
    """The REFERENCE argument as ``[ReferenceImage]``: a folder, a CSV table or one file."""
    from ..explain.reference_images import ReferenceImage, list_reference_images, list_table_images

    if os.path.isdir(args.reference):
        return list_reference_images(args.reference)
    if os.path.isfile(args.reference) and args.reference.lower().endswith(".csv"):
        return list_table_images(args.reference, args.columns)
    if os.path.isfile(args.reference):
        return [ReferenceImage(args.reference, None)]
    raise FileNotFoundError(f"reference {args.reference} not found")


class _Files:
    """Image files as the runner's image check reads a dataset (``paths``, ``labels``)."""

    def __init__(self, paths):
        import numpy as np

        self.paths = list(paths)
        self.labels = np.zeros(len(self.paths), dtype=np.int64)

    def __len__(self):
        return len(self.paths)


def drop_bad(refs: list, skip: bool, where: str) -> list:
    """``refs`` whose files all decode: the runner's one image check
    (:func:`pml_extensions.runner.objects.preflight.check_images`): every bad file named in one line, or with ``skip``
    left out with one note."""
    from ..runner.objects.preflight import check_images

    files = _Files(r.path for r in refs)
    kept = check_images(files, None, skip, where, log=print, skip_hint="--skip_bad_images")
    return refs if kept is files else [refs[int(i)] for i in kept.indices]


class RunData:
    """What a run trained and tested on, as explain reads it: its model pick, test images (``refs``, class names as
    the dataset has them) and eval transform (the variant's config)."""

    def __init__(self, args, run: str):
        import numpy as np

        from ..explain.reference_images import ReferenceImage
        from ..runner.config.loader import variant_configs
        from ..runner.objects.builder import Builder
        from ..runner.objects.data import dataset_labels
        from ..runner.objects.preflight import image_paths
        from ..runner.objects.saved_models import checkpoint_epoch, find_run_config, selected_model

        if args.checkpoint is not None:
            if args.variant is not None or args.seed is not None or args.fold is not None:
                raise ValueError("--variant / --seed / --fold choose the run's model: leave them out with --checkpoint")
            self.checkpoint, self.epoch = args.checkpoint, checkpoint_epoch(args.checkpoint)
            # the unit the file belongs to: <variant>/seed_<s>/... or fold_<k>/...
            self.unit = os.path.relpath(os.path.abspath(args.checkpoint), os.path.abspath(run))
            self.others, variant = [], self.unit.split(os.sep)[0]
        else:
            pick = selected_model(run, args.variant, args.seed, args.fold)
            self.checkpoint, self.epoch, self.unit = pick["checkpoint"], pick["epoch"], pick["unit"]
            self.others, variant = pick["others"], pick["variant"]
        cfg, _ = find_run_config(run, levels=0)
        if cfg is None:
            raise ValueError(f"--run {run} has no config.yaml")
        if variant in (cfg.get("variants") or {}):
            cfg = variant_configs(cfg, [variant])[variant]
        # every image file listed (explain leaves out the bad ones itself, naming them: drop_bad)
        self.builder = Builder({**cfg, "skip_bad_images": False}, log=lambda *a, **k: None)
        self.dataset, self.files, self.index = None, False, {}
        if args.reference is not None:
            return
        if cfg.get("dataset") is None:
            raise ValueError(f"--run {run}: its config has no dataset key to read the test images from; pass REFERENCE")
        results, test = os.path.join(run, "results.json"), None
        if os.path.isfile(results):  # a protocol that split the classes itself lists its test classes there
            with open(results, encoding="utf-8") as f:
                test = json.load(f).get("test_classes")
        data = self.builder.build_dataset(None if test is not None else "test")
        paths = image_paths(data)
        self.files = paths is not None
        if paths is None:  # images drawn or decoded by the dataset itself (glyphs, Fashion-MNIST): one name per item
            paths = [f"{type(data).__name__}[{i}]" for i in range(len(data))]
        labels = dataset_labels(data)
        keep = np.arange(len(paths))
        if test is not None:
            keep = np.nonzero(np.isin(labels, np.asarray(test)))[0]
        classes = getattr(data, "classes", None)
        self.dataset, self.index = data, {paths[int(i)]: int(i) for i in keep}

        def name(y):
            return str(classes[int(y)]) if classes is not None and 0 <= int(y) < len(classes) else str(int(y))

        refs = [ReferenceImage(paths[int(i)], name(labels[int(i)])) for i in keep]
        skip = bool(args.skip_bad_images or cfg.get("skip_bad_images") is True)
        self.refs = drop_bad(refs, skip, f"--run {run}: dataset") if self.files else refs

    def loader(self):
        """``path -> [C, H, W]``: the dataset's own reading of its items (boxes cropped, transparency on white) or
        the file, through the run's eval transform."""
        import torch

        from ..explain.reference_images import read_image

        transform = self.builder.build_transform("eval")
        load = getattr(self.dataset, "load_image", None) if self.files else None

        def read(path):
            if path in self.index:  # an item of the run's dataset, read as the dataset reads it
                i = self.index[path]
                image = load(i) if load is not None else self.dataset[i][0]
            else:
                image = read_image(path, "RGB")
            x = transform(image)
            if not torch.is_tensor(x) or x.ndim != 3:
                raise ValueError(f"the run's transforms.eval gives {type(x).__name__}, not a [C, H, W] tensor")
            return x

        return read
