"""Checks before the first epoch (``docs/own_data.md``): image files that decode, enough classes for the split and the
sampler, the images' channels and sizes against the trunk; each problem one line naming the key or file and the fix."""

import contextlib
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...utils.atomic_io import atomic_write_json, atomic_write_text
from ...utils.checks import is_int
from ..config.loader import describe, source_of
from ..config.registry import lookup
from ..config.specs import is_object_spec, one_spec
from ..errors import ConfigError, DataFileError
from .data import Subset, ToRGB, dataset_labels

#: the experiment folder's record of the image files that decoded: {path: [size, mtime_ns]}
IMAGE_CHECK_FILE = "images_checked.json"
#: at most this many bad files are named in the one line (all of them go to bad_images.txt)
NAMED_BAD_FILES = 20
#: the files this process saw decode: {path: [size, mtime_ns]} (a run builds its datasets several times)
_DECODED: Dict[str, List[int]] = {}
#: the notes this process gave about left-out files (said once, however often a dataset is built)
_NOTED: set = set()


def image_paths(dataset) -> Optional[List[str]]:
    """The image file of each item (``paths`` or torchvision's ``samples``), or None for data that is not files."""
    for candidate in (dataset, getattr(dataset, "dataset", None)):
        if candidate is None:
            continue
        paths = getattr(candidate, "paths", None)
        if paths is None and isinstance(getattr(candidate, "samples", None), list):
            paths = [s[0] for s in candidate.samples if isinstance(s, (tuple, list)) and s]
        if paths is not None and len(paths) == len(dataset) and all(isinstance(p, str) for p in paths[:1]):
            return list(paths)
    return None


def _stat(path: str) -> Optional[List[int]]:
    with contextlib.suppress(OSError):
        s = os.stat(path)
        return [int(s.st_size), int(s.st_mtime_ns)]
    return None


def read_json_object(path: Optional[str]) -> Dict[str, Any]:
    """The JSON object in ``path``; {} without a path or file, or for an unreadable one or another JSON value."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (TypeError, OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_record(record: str, old: Dict[str, List[int]], new: Dict[str, List[int]]) -> None:
    if new != old:
        with contextlib.suppress(OSError):  # the record only saves a rerun the decoding
            atomic_write_json(record, new)


def _named(entries: List[str]) -> str:
    more = f"; +{len(entries) - NAMED_BAD_FILES} more" if len(entries) > NAMED_BAD_FILES else ""
    return "; ".join(entries[:NAMED_BAD_FILES]) + more


def check_images(dataset, folder=None, skip=False, where="dataset", log=print, skip_hint="--skip_bad_images true"):
    """``dataset`` once every image file decodes, or with ``skip`` a view without the bad ones (one note). The
    experiment ``folder`` records the files that decoded (:data:`IMAGE_CHECK_FILE`) and lists the bad ones;
    ``skip_hint``: the option that leaves bad files out (None: none). Raises DataFileError naming the bad files."""
    from PIL import Image

    from ...datasets.image_files import find_unreadable_images, large_images

    paths = image_paths(dataset)
    if paths is None:
        return dataset
    record = os.path.join(folder, IMAGE_CHECK_FILE) if folder else None
    recorded = read_json_object(record)
    known = {**recorded, **_DECODED}
    todo = [p for p in dict.fromkeys(paths) if p not in known or known[p] != _stat(p)]
    if len(todo) > 1000:
        log(f"checking that {len(todo)} image files decode (once; a rerun checks only new or changed files)")
    bad = find_unreadable_images(todo)
    bad_set = {p for p, _ in bad}
    large = large_images([p for p in todo if p not in bad_set])
    if large:
        log(
            f"note: {where}: {len(large)} image(s) above PIL's decompression-bomb limit ({Image.MAX_IMAGE_PIXELS} "
            "pixels), decoded in full at every read (slow; shrink them to speed up each epoch): "
            + _named([f"{p} ({w} × {h})" for p, (w, h) in large])
        )
    good = {p: _stat(p) for p in todo if p not in bad_set}
    _DECODED.update(good)
    if record:  # the record keeps the other datasets' files of the folder (a paired run's train and test data)
        mine = {p: known[p] for p in paths if p in known and p not in bad_set}
        kept = {p: v for p, v in recorded.items() if p not in bad_set}
        _save_record(record, recorded, {**kept, **mine, **good})
    if not bad:
        return dataset
    listing = write_bad_images(dict(bad), folder) if folder else None
    named = _named([f"{p} ({why})" for p, why in bad])
    listed = f" (all in {listing})" if listing else ""
    if skip:
        note = f"note: {where}: left out {len(bad)} image(s) that do not decode{listed}: {named}"
        if note not in _NOTED:
            _NOTED.add(note)
            log(note)
        kept = Subset(dataset, [i for i, p in enumerate(paths) if p not in bad_set], dataset_labels(dataset), None)
        kept.left_out = dict(bad)  # for bad_images.txt once the experiment folder exists (write_bad_images)
        return kept
    leave_out = f", or leave them out with {skip_hint}" if skip_hint else ""
    raise DataFileError(
        f"{where}: {len(bad)} of {len(paths)} images do not decode{listed}: {named}; replace or remove them{leave_out}"
    )


def write_bad_images(left_out: Dict[str, str], folder: str) -> Optional[str]:
    """``folder``'s ``bad_images.txt`` listing ``left_out`` (``{path: reason}``); None when empty or no folder."""
    if not left_out or not os.path.isdir(folder):
        return None
    path = os.path.join(folder, "bad_images.txt")
    atomic_write_text(path, "".join(f"{p}\t{why}\n" for p, why in sorted(left_out.items())))
    return path


def record_checked_images(dataset, folder: str) -> None:
    """Record in ``folder`` the files :func:`check_images` checked (and left out) before it existed."""
    write_bad_images(getattr(dataset, "left_out", None), folder)
    paths = image_paths(dataset)
    if paths is None or not os.path.isdir(folder):
        return
    record = os.path.join(folder, IMAGE_CHECK_FILE)
    known = read_json_object(record)
    _save_record(record, known, {**known, **{p: _stat(p) for p in dict.fromkeys(paths) if p not in known}})


def minimum_classes(split: Callable, m: Optional[int] = None, batch_size=None, limit: int = 5000) -> Optional[int]:
    """The fewest classes for which ``split(range(C))`` succeeds and, with an ``m``-per-class sampler, every fold's
    training classes fill a batch (``m × classes >= batch_size``); None above ``limit``."""
    for count in range(2, limit + 1):
        try:
            folds = split(list(range(count)))["folds"]
        except ValueError:
            continue
        if m and batch_size and min(len(f["train"]) for f in folds) * m < batch_size:
            continue
        return count
    return None


def _class_and_int(builder, key: str, arg: str, default: Optional[int]) -> Tuple[Optional[str], Optional[int]]:
    spec = builder.get(key)
    if not is_object_spec(spec):
        return None, default
    name, kwargs = one_spec(spec, builder.where(key))
    value = kwargs.get(arg)
    return name, (int(value) if is_int(value) and value > 0 else default)


def class_splits(builder, labels, split: Callable, partitions: int, num_sets: int) -> Dict[str, Any]:
    """``split(labels, partitions)``, or a ConfigError for too few classes: how many the config needs (split and
    sampler together), where the settings came from and the command-line change that fits this dataset."""
    try:
        return split(labels, partitions)
    except ValueError as e:
        problem = str(e).splitlines()[0]
    classes = len(np.unique(np.asarray(labels)))
    sampler, m = _class_and_int(builder, "sampler", "m", None)
    _, batch = _class_and_int(builder, "trainer", "batch_size", 32)
    need = minimum_classes(lambda ls: split(ls, partitions), m, batch)
    fix = ""
    for parts in range(min(partitions, classes) - 1, 1, -1):  # the most folds this dataset allows
        try:
            folds = split(list(range(classes)), parts)["folds"]
        except ValueError:
            continue
        sets = min(num_sets, parts)
        change = f'--split_manager~APPLY~2 "{{num_training_partitions: {parts}, num_training_sets: {sets}}}"'
        fewest = min(len(f["train"]) for f in folds)
        if m and fewest * m < batch:
            change += f' --trainer~APPLY~2 "{{batch_size: {fewest * m}}}"'
        fix = f"; for these {classes} classes add {change}"
        break
    if not fix:  # no fewer folds fit: say how many classes the smallest split needs, not only this config's count
        least = minimum_classes(lambda ls: split(ls, 2))
        if least and least > classes and least != need:
            fix = f"; 2 partitions, the fewest, need >= {least} classes at this test_size"
    needs = f"this config needs >= {need} classes" if need else "no class count fits this split"
    with_sampler = f" and {sampler} (m={m}) batches of {batch}" if m else ""
    count = "1 class is" if classes == 1 else f"{classes} classes are"
    raise ConfigError(
        f"{source_of(builder.sources, 'dataset')}: dataset: {count} too few for split_manager "
        f"({describe(source_of(builder.sources, 'split_manager'))}: {problem}){with_sampler}: {needs}{fix}"
    )


def check_sampler(builder, fold_train_labels: Sequence, batch_size: int, batch_key: Optional[str] = None) -> None:
    """ConfigError unless the sampler's ``m`` divides ``batch_size`` and ``m × classes >= batch_size`` in every fold
    (what PML's ``MPerClassSampler`` asserts at the first epoch). ``batch_key``: the key setting the batch size."""
    name, m = _class_and_int(builder, "sampler", "m", None)
    if m is None:
        return
    sources = builder.sources
    m_src = describe(source_of(sources, ("sampler", name, "m")))
    trainer, _ = _class_and_int(builder, "trainer", "batch_size", 32)
    batch_path = batch_key or (("trainer", trainer, "batch_size") if trainer else "trainer")
    batch_src = describe(source_of(sources, batch_path))
    set_batch = f"--{batch_key} {{}}" if batch_key else '--trainer~APPLY~2 "{{batch_size: {}}}"'
    if batch_size % m:
        raise ConfigError(
            f"{source_of(sources, 'sampler')}: sampler.{name}.m: {m} ({m_src}) does not divide the batch size "
            f"{batch_size} ({batch_src}); use a batch size that is a multiple of {m}"
        )
    for fold, labels in enumerate(fold_train_labels):
        classes = len(np.unique(np.asarray(labels)))
        if classes * m < batch_size:
            which = f" of fold {fold}" if batch_key is None else ""
            raise ConfigError(
                f"{source_of(sources, 'sampler')}: sampler.{name}: m={m} ({m_src}) x {classes} training classes"
                f"{which} = {classes * m} < batch_size {batch_size} ({batch_src}); add "
                f"{set_batch.format(classes * m)} or use a dataset with more classes"
            )


class ChannelMismatch(ConfigError):
    """The trunk takes ``trunk_channels`` input channels; the images have ``image_channels``."""

    def __init__(self, message: str, image_channels: int, trunk_channels: int):
        super().__init__(message)
        self.image_channels, self.trunk_channels = int(image_channels), int(trunk_channels)


def _first_entry(spec: Any) -> Tuple[Any, Any, Callable[[Any], Any]]:
    """``(name, kwargs, put)`` of the trunk's first layer; ``put(new)``: the trunk spec with ``new`` in its place."""
    if isinstance(spec, list) and spec:
        name, kwargs, put = _first_entry(spec[0])
        return name, kwargs, lambda new: [put(new)] + list(spec[1:])
    if isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) == "Sequential":
        name, kwargs, put = _first_entry(spec["Sequential"])
        return name, kwargs, lambda new: {"Sequential": put(new)}
    name, kwargs = next(iter(spec.items())) if isinstance(spec, dict) and len(spec) == 1 else (None, None)
    return name, kwargs, lambda new: new


def fill_input_channels(trunk_spec: Any, channels: int) -> Any:
    """The trunk spec with ``in_channels: channels`` added to its first layer when it takes and lacks it."""
    name, kwargs, put = _first_entry(trunk_spec)
    entry = lookup(name) if isinstance(name, str) and (kwargs is None or isinstance(kwargs, dict)) else None
    if entry is None or "in_channels" not in entry["params"] or "in_channels" in (kwargs or {}):
        return trunk_spec
    return put({name: dict(kwargs or {}, in_channels=int(channels))})


def trunk_input_channels(trunk: torch.nn.Module) -> Optional[int]:
    """The input channels of the trunk's first convolution (None when it has none)."""
    return next((int(m.in_channels) for m in trunk.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)), None)


def channel_mismatch(builder, trunk: torch.nn.Module, sample: torch.Tensor, error: Exception) -> ConfigError:
    """The error for a trunk that fails on ``sample``: :class:`ChannelMismatch` when the channels differ."""
    wanted = trunk_input_channels(trunk)
    have = int(sample.shape[0]) if sample.ndim == 3 else None
    trunk_src = source_of(builder.sources, "models.trunk")
    if wanted is None or have is None or wanted == have:
        return ConfigError(
            f"{trunk_src}: models.trunk: fails on one image of shape {list(sample.shape)}: {str(error).splitlines()[0]}"
        )
    name, kwargs, _ = _first_entry(builder.get("models", {}).get("trunk"))
    takes = f" (its first layer {name} sets in_channels: {wanted}; leave it out and the images' count is used)"
    takes = takes if "in_channels" in (kwargs or {}) else ""
    grey = "convert the images to grey (add Grayscale: {num_output_channels: 1} first in transforms)"
    fixes = grey if wanted == 1 else f"give the trunk {have}-channel input"
    return ChannelMismatch(
        f"{trunk_src}: models.trunk takes {wanted} input channel(s) ({describe(trunk_src)}){takes}, but the images of "
        f"dataset ({describe(source_of(builder.sources, 'dataset'))}) have {have} after transforms.eval; {fixes}",
        have,
        wanted,
    )


def fit_channels(builder, dataset, transforms: Dict[str, Any], num_classes: int, getter=None, log=print):
    """``transforms`` once the trunk takes the first image through ``transforms["eval"]``: grey images become RGB
    for a 3-channel trunk (one note); ConfigError (:class:`ChannelMismatch`) when the trunk or transform fails."""

    def first(transform):
        return builder.subset(dataset, [0], transform=transform, getter=getter)[0][0]

    try:
        sample = first(transforms["eval"])
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a transform that does not fit the images: one line naming it
        raise ConfigError(
            f"{source_of(builder.sources, 'transforms')}: transforms.eval: fails on the first image of dataset: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    if not torch.is_tensor(sample):
        return transforms
    check_sizes(builder, dataset, transforms["eval"], sample, getter)
    try:
        builder.build_models(sample, num_classes, image=True)
    except ChannelMismatch as e:
        if not (e.image_channels == 1 and e.trunk_channels == 3 and hasattr(first(None), "convert")):
            raise
        import torchvision.transforms as T

        transforms = {k: T.Compose([ToRGB(), t]) for k, t in transforms.items()}
        log("note: the images are grey and models.trunk takes 3 channels: they are read as RGB")
        builder.build_models(first(transforms["eval"]), num_classes, image=True)
    return transforms


def check_sizes(builder, dataset, transform, first: torch.Tensor, getter=None, probes: int = 8) -> None:
    """ConfigError (the Resize to add) when items spread over ``dataset`` differ from the first one's shape."""
    n = len(dataset)
    paths = image_paths(dataset)
    for i in sorted({int(round(k * (n - 1) / max(1, probes - 1))) for k in range(probes)} - {0}):
        x = builder.subset(dataset, [i], transform=transform, getter=getter)[0][0]
        if torch.is_tensor(x) and x.shape != first.shape:
            what = f"{paths[0]} and {paths[i]}" if paths else f"items 0 and {i}"
            side = min(224, *first.shape[-2:], *x.shape[-2:])  # a square no larger than the images, nor than 224
            raise ConfigError(
                f"{source_of(builder.sources, 'transforms')}: transforms.eval gives images of different sizes "
                f"({list(first.shape)} and {list(x.shape)} for {what}), which cannot be batched; start transforms "
                f"train and eval with Resize: {{size: [{side}, {side}]}} (or the size the trunk expects)"
            )
