"""The ``paired`` protocol (docs/runner.md, "Protocols"): variants of one config trained with paired seeds, selected
on held-out training classes, tested once on unseen classes, compared; the unit: :mod:`.unit`."""

import dataclasses
import functools
import json
import os
from typing import Any, Dict, Optional

from ...errors import ConfigError
from ..base import REQUIRED, setting
from ..paired_protocol import PairedProtocol

METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")
DEFAULT_CALCULATOR = {"AccuracyCalculator": {"include": list(METRICS), "k": "max_bin_count"}}


@dataclasses.dataclass
class Settings:
    """The keys of one variant of the ``paired`` protocol (each variant's merged config is read with them)."""

    dataset: Any = setting(
        REQUIRED,
        "The data: a name `{name: glyphs, root: ..., kwargs: {...}}` (glyphs, openclipart, fashion_mnist, imagefolder, "
        "csv, cub, cars196, sop) or `{DatasetClass: kwargs}` with train and test splits.",
    )
    models: Dict[str, Any] = setting(REQUIRED, "`{trunk: spec, embedder: spec, ...}`.", "mapping")
    loss_funcs: Dict[str, Any] = setting(REQUIRED, "`{name: {LossClass: kwargs}}`; losses nest.", "mapping")
    optimizers: Dict[str, Any] = setting(
        REQUIRED, "`{<model or loss>_optimizer: {OptimizerClass: kwargs}}`.", "mapping"
    )
    transforms: Dict[str, Any] = setting(REQUIRED, "`{train: ..., eval: ...}` torchvision transforms.", "mapping")
    num_epochs: int = setting(REQUIRED, "Epochs per variant and seed.", "int", minimum=1)
    iterations_per_epoch: int = setting(REQUIRED, "Training iterations per epoch.", "int", minimum=1)
    batch_size: int = setting(REQUIRED, "Training batch size (the global batch under torchrun).", "int", minimum=1)
    mining_funcs: Dict[str, Any] = setting({}, "`{name: {MinerClass: kwargs}}` or `{}`.", "mapping", optional=True)
    sampler: Any = setting(None, "The batch sampler, e.g. `{MPerClassSampler: {m: 4}}`.")
    trainer: Any = setting(None, "The PML trainer class (default `MetricLossOnly`), e.g. `{TrainWithClassifier: {}}`.")
    tester: Any = setting({"GlobalEmbeddingSpaceTester": {}}, "The PML tester.")
    accuracy_calculator: Any = setting(DEFAULT_CALCULATOR, "The tester's accuracy calculator.")
    dataloader_num_workers: int = setting(0, "DataLoader worker processes.", "int", minimum=0)
    validation: Dict[str, Any] = setting(
        {"class_fraction": 0.25, "seed": 0},
        "`{class_fraction, seed}`: the held-out part of the training classes that selects the tested epoch (a "
        "table with validation and test rows selects on its validation rows instead).",
        "mapping",
    )
    prototype_init: Any = setting(None, "Initialise the trunk's `HistogramPooling` prototypes from training images.")
    feature_cache: Any = setting(None, "Train the trunk's rest on cached outputs of its frozen prefix.")
    teacher: Any = setting(
        None,
        "A finished run's checkpoint (what `explain --checkpoint` reads; `{seed}` becomes the unit's seed), or "
        "`{checkpoint, init_student}`: the frozen teacher of a distilling trainer (`ResolutionDistillationTrainer`); "
        "the student starts from its weights unless `init_student: false`.",
    )
    coupled_augmentation: Any = setting(
        None,
        "`{query_size, database_size, num_augmentations, ...}`: train on `CoupledAugmentationDataset` views of the "
        "training images, small for the student and large for the teacher (what a distilling trainer takes).",
        "mapping",
    )
    dataset_root: Optional[str] = setting(None, "Folder given to datasets that take `root`.", "str")
    normalize: Any = setting(None, "The `Normalize` appended to the transforms (default ImageNet's).")
    skip_bad_images: bool = setting(False, "`true` leaves out image files that do not decode.", "bool")


class Paired(PairedProtocol):
    """Variants trained with paired seeds on one dataset and compared (see the module docstring)."""

    name = "paired"
    description = "variants of one config trained with paired seeds, selected on validation classes, compared"
    Settings = Settings
    metrics = METRICS

    @classmethod
    def data_folder(cls, path: str, is_csv: bool, columns=None) -> Dict[str, Any]:
        """Your folder of class folders (or CSV file) as the dataset ``imagefolder`` (``csv``)."""
        spec = {"name": "csv" if is_csv else "imagefolder", "root": path}
        if columns:
            spec["kwargs"] = {"columns": columns}
        return {"dataset~OVERRIDE~": spec}

    def __init__(self, config, folder, sources=None, log=print):
        from .unit import resolve_cache_folder

        super().__init__(config, folder, sources, log)
        # each variant's one config (feature_cache.folder made absolute): units, tests, examples, preflight, caches
        self.variant_configs = {n: resolve_cache_folder(c, folder) for n, c in self.variant_configs.items()}

    @classmethod
    def check_variants(cls, configs, where) -> None:
        from ...objects.feature_cache import cache_spec

        for name, cfg in configs.items():
            for key, sub in (("models", "trunk"), ("transforms", "train"), ("transforms", "eval")):
                if cfg[key].get(sub) is None:
                    raise ConfigError(f"{where[name].get(key, 'config')}: missing key {key}.{sub}")
            cache_spec(cfg, where[name])

    def unit(self, settings, variant, seed, folder, builder):
        from .unit import evaluate, train_and_select

        cfg, sources = self.variant_configs[variant], self.variant_sources[variant]
        r = train_and_select(variant, cfg, seed, folder, self.device, self.log, sources, self.keep_epochs)
        if self.settings.selection == "best_epoch":
            r["test"] = evaluate(cfg, r["models"], self.device, "test", sources=sources, seed=seed)
        return r

    def test(self, settings, variant, seed, folder, builder, epoch):
        from .unit import evaluate, load_models

        cfg, sources = self.variant_configs[variant], self.variant_sources[variant]
        path = self.epoch_path(folder, epoch)
        if not os.path.exists(path):
            raise ConfigError(f"{folder}: no weights of epoch {epoch} (was the unit trained with another selection?)")
        models = load_models(cfg, folder, self.device, path=path)
        return evaluate(cfg, models, self.device, "test", sources=sources, seed=seed)

    def examples(self, settings, variant, seed, folder, builder, epoch):
        from .unit import save_retrieval

        save_retrieval(variant, self.variant_configs[variant], folder, self.folder, self.device, seed, epoch)

    def preflight(self) -> None:
        """Every problem in one refusal: the keys the methods check (e.g. a teacher), a cached prefix that depends on
        the seed, and each distinct dataset: it builds, every image decodes, the training classes hold a validation
        part and the sampler's batches, the images fit the trunk."""
        import numpy as np

        from ...errors import Problems
        from ...objects import preflight
        from ...objects.builder import Builder
        from ...objects.data import dataset_labels, validation_rows, validation_split
        from ...objects.feature_cache import check_fixed_prefix
        from .unit import hooks, load_run_models

        problems, seen, memo = Problems(), set(), set()
        record = self.folder if os.path.isdir(self.folder) else None  # a rerun reads its record of decoded files
        quiet = lambda *a, **k: None  # noqa: E731
        for name, cfg in self.variant_configs.items():
            sources, s = self.variant_sources[name], self.variant_settings[name]
            b = Builder(dict(cfg), sources, self.device, quiet)
            with problems.check():  # memo: shared by the variants (e.g. each teacher checkpoint loads once)
                hooks(b, "check", self.settings.seeds, load_run_models, memo)
            signature = json.dumps([cfg["models"]["trunk"], cfg.get("feature_cache")], default=str)
            if cfg.get("feature_cache") is not None and signature not in seen:
                seen.add(signature)
                with problems.check():
                    make = functools.partial(Builder, cfg, sources, self.device, quiet)
                    check_fixed_prefix(make, self.settings.seeds, b.where("feature_cache"))
            key = json.dumps([cfg.get(k) for k in ("dataset", "sampler", "batch_size", "validation")], default=str)
            if key in seen:
                continue
            seen.add(key)
            where = b.where("dataset")
            splits, rows, roles = ["train", "test"], None, {}  # roles: class names of train, validation, test
            for split in splits:
                data = None
                with problems.check():
                    data = b.build_dataset(split)
                if data is None:
                    break
                if split == "train" and validation_rows(data):  # a table's validation rows validate
                    rows = validation_rows(data)
                    splits.insert(1, "validation")  # checked next, before the test rows
                    self.log(
                        f"note: {where}: the split column's validation rows (classes {_shown(rows)}) select the "
                        "tested epoch; every train row trains (validation.class_fraction is not used)"
                    )
                images_ok = False
                with problems.check():
                    data = preflight.check_images(data, record, s.skip_bad_images, where, self.log)
                    self.left_out.update(getattr(data, "left_out", {}))
                    self.checked_data.append(data)
                    images_ok = True
                if split != "train":
                    ids = sorted({int(v) for v in dataset_labels(data)})
                    if split == "test" and not self.class_roles and len(ids) < 2:
                        with problems.check():
                            raise ConfigError(
                                f"{where}: the test split of {_data_words(s.dataset)} has {len(ids)} class(es); "
                                "retrieval on unseen classes needs at least 2"
                            )
                    roles[split] = _class_names(data, ids)
                    continue
                labels = parts = None
                with problems.check():
                    labels = dataset_labels(data)
                    fraction, vseed = s.validation.get("class_fraction", 0.25), s.validation.get("seed", 0)
                    try:
                        whole = (np.arange(len(labels)), None, None)  # the table's validation rows validate
                        parts = whole if rows else validation_split(labels, fraction, vseed)
                    except ConfigError as e:  # too few classes: the data's count, and where the data came from
                        raise ConfigError(
                            f"{b.where('validation')}: {e} ({_data_words(s.dataset)} has {len(np.unique(labels))} "
                            "training classes)"
                        ) from None
                if parts is None:
                    continue
                roles["train"] = _class_names(data, sorted({int(v) for v in labels[parts[0]]}))
                if parts[2] is not None:
                    roles["validation"] = _class_names(data, [int(i) for i in parts[2]])
                with problems.check():
                    preflight.check_sampler(b, [labels[parts[0]]], s.batch_size, batch_key="batch_size")
                if images_ok:  # the channels are read from an image
                    with problems.check():
                        sample = b.subset(data, parts[0][:1], labels, b.build_transform("eval"))[0][0]
                        if hasattr(sample, "ndim"):  # images of several sizes need a Resize to be batched
                            preflight.check_sizes(b, data, b.build_transform("eval"), sample)
                            if cfg.get("feature_cache") is None:
                                b.build_models(sample, int(max(labels)) + 1)
            if not self.class_roles and "test" in roles:
                self.class_roles = roles
                self.log("classes: " + "; ".join(f"{r} {len(names)} ({_shown(names)})" for r, names in roles.items()))
        problems.raise_any()

    def build_caches(self, rank: Optional[int] = None, world_size: Optional[int] = None) -> bool:
        """Build the feature caches of every variant (or shard ``rank`` of ``world_size``); whether all are complete."""
        from ...objects.builder import Builder
        from ...objects.data import validation_rows
        from .unit import load_split

        done, seen = True, set()
        for name, cfg in self.variant_configs.items():
            if cfg.get("feature_cache") is None:
                continue
            signature = json.dumps([cfg["feature_cache"], cfg["models"]["trunk"], cfg["dataset"], cfg["transforms"]])
            if signature in seen:
                continue
            seen.add(signature)
            b = Builder(cfg, self.variant_sources[name], self.device, self.log)
            parts = [("train", True), ("train", False), ("test", False)]
            if validation_rows(b.build_dataset("train")):
                parts.insert(2, ("validation", False))
            for split, train in parts:
                out = load_split(cfg, split, train, builder=b, rank=rank, world_size=world_size)
                done = (out[1] if rank is not None or world_size is not None else True) and done
        return done

    def header(self, results: Dict[str, Any]) -> str:
        from ....utils import wiring
        from ...experiment.folder import environment_summary
        from ...objects.builder import Builder
        from .unit import test_classes_words

        seeds, first = results["seeds"], next(iter(self.variant_configs))
        unit, s = results["units"][first][str(seeds[0])], self.variant_settings[first]
        selection = results.get("selection") or {"mode": "best_epoch"}
        mode = selection.get("mode", "best_epoch")
        how = {
            "best_epoch": "best epoch chosen",
            "mean_validation_curve": "one epoch per group of compared variants chosen on their mean validation curve "
            "over all seeds",
            "last": "the last epoch tested (validation curves",
        }[mode]
        held_out = (
            "classes of the table's validation rows" if unit.get("validation_rows") else "held-out training classes"
        )
        text = (
            f"Dataset `{dataset_name(s.dataset)}`: trained on {unit['num_train_classes']} classes, {how} on "
            f"{unit['num_val_classes']} {held_out}{')' if mode == 'last' else ''} (validation), tested "
            f"once on the {test_classes_words(s.dataset)}. {s.num_epochs} epochs × {s.iterations_per_epoch} "
            f"iterations, batch {s.batch_size}, seeds {', '.join(map(str, seeds))} (paired: same initial weights "
            f"for shared modules and same batches within a seed), device {results['device']}. Test metrics; "
            "differences are paired by seed, 95 % Student-t interval."
        )
        tested = [
            f"{', '.join(c['variants'])}: {c['epoch']}"
            + (" (the untrained model's mean validation was higher)" if c.get("untrained_best") else "")
            for c in (selection.get("curves") or {}).values()
        ]
        text += f" Tested epochs: {'; '.join(tested)}." if tested else ""
        if results.get("environment"):
            text += f" Environment: {environment_summary(results['environment'])}."
        builders = {n: Builder(c or {}, log=lambda *a, **k: None) for n, c in self.variant_configs.items()}
        for describe in wiring.unit_steps("describe"):  # e.g. the variants that start from a frozen teacher
            words = describe(builders)
            text += f" {words}" if words else ""
        untrained = results.get("untrained")
        if untrained:
            text += (
                f" `untrained`: {untrained['variant']} at epoch 0 (validation MAP@R at epoch 0 of the variants "
                f"differs by at most {untrained['max_val_spread_at_epoch_0']:.2g} within a seed)."
            )
        return text

    def extra_results(self, units):
        first = self.variant_settings[next(iter(self.variant_configs))]
        keys = ("dataset", "num_epochs", "iterations_per_epoch", "batch_size", "validation")
        return {**{k: getattr(first, k) for k in keys}, **({"classes": self.class_roles} if self.class_roles else {})}


def _class_names(data, ids) -> list:
    """The class names of labels ``ids`` of ``data``, else the labels."""
    from ....explain.explanation_hook import dataset_class_names

    names = dataset_class_names(data)
    return [names[i] if names is not None and 0 <= i < len(names) else i for i in ids]


def _shown(names, limit: int = 6) -> str:
    return ", ".join(map(str, names[:limit])) + (", ..." if len(names) > limit else "")


def _data_words(spec: Any) -> str:
    """``"the dataset imagefolder (photos)"``: the dataset's name and its path."""
    root = spec.get("root") if isinstance(spec, dict) and "name" in spec else None
    return f"the dataset {dataset_name(spec)}" + (f" ({root})" if root else "")


def dataset_name(spec: Any) -> Optional[str]:
    """The dataset's name: ``glyphs``, ``{name: glyphs, ...}`` or the class of ``{ClassName: kwargs}``."""
    if isinstance(spec, str):
        return spec or None
    if isinstance(spec, dict):
        return spec.get("name") if "name" in spec else (next(iter(spec)) if len(spec) == 1 else None)
    return None


PROTOCOL = Paired
