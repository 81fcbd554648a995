"""The "Metric Learning Reality Check" (MLRC) protocol's settings and checks (Musgrave, Belongie & Lim, ECCV 2020,
Sec. 4); the run is :mod:`.runner`. Steps and keys: docs/runner.md and docs/configs.md."""

import dataclasses
import functools
from typing import Any, Dict

from ...config import pb_keys
from ...errors import ConfigError
from ..base import Protocol, setting
from .old_keys import OLD_TOP_LEVEL_KEYS, map_old_keys

__all__ = ["MLRC", "Settings", "csv_split_classes"]


def csv_split_classes(path: str, columns: Dict[str, str]):
    """``(training classes, test classes, split column)`` of a CSV file read by
    :class:`~pml_extensions.datasets.ImageCSVSplit`: the test rows are those marked ``test`` / ``testing``, else (OML's
    convention) ``validation``; the other rows train. None without a split column or for a table ImageCSVSplit refuses.
    """
    from ....datasets import ImageCSVSplit

    try:
        table = ImageCSVSplit(path, "all", columns=columns or None)
    except (OSError, ValueError):
        return None
    if table.columns.get("split") is None:
        return None
    by_split = table.classes_by_split
    train = by_split.get("train", []) + (by_split.get("validation", []) if "test" in by_split else [])
    return train, by_split.get("test") or by_split.get("validation", []), table.columns["split"]


def _doc(text: str) -> Any:
    return setting(None, text)


@dataclasses.dataclass
class Settings:
    """The top-level keys of the ``mlrc`` protocol (powerful-benchmarker v0.9.33's names and ours). Their values are
    powerful-benchmarker specs, checked by :mod:`pml_extensions.runner.config.pb_keys` and the Builder."""

    trainer: Any = _doc(
        "The PML trainer, `{MetricLossOnly: {batch_size, iterations_per_epoch, dataloader_num_workers, ...}}`; "
        "`batch_size` is the global batch (split over `torchrun` ranks)."
    )
    num_epochs_train: Any = setting(
        None, "Most epochs per fold (powerful-benchmarker's; early stopping usually ends sooner).", "int", minimum=1
    )
    save_interval: Any = setting(
        None, "Evaluate `splits_to_eval` (and checkpoint the best model) every this many epochs.", "int", minimum=1
    )
    patience: Any = setting(
        None, "Stop a fold when the primary metric has not improved for more than this many evaluations.", "int", 0
    )
    check_untrained_accuracy: Any = _doc(
        "Evaluate the untrained model as epoch 0 (the report flags a fold whose best epoch is 0)."
    )
    api_parser: Any = _doc("powerful-benchmarker's internal parser name; only `null` (see the config_general flags).")
    skip_eval_if_already_done: Any = _doc("See the config_general flags.")
    skip_ensemble_eval_if_already_done: Any = _doc("See the config_general flags.")
    log_data_to_tensorboard: Any = _doc("See the config_general flags.")
    save_figures_on_tensorboard: Any = _doc("See the config_general flags.")
    save_lists_in_db: Any = _doc("See the config_general flags.")
    override_required_compatible_factories: Any = _doc("See the config_general flags.")
    models: Any = _doc(
        "`{trunk: spec, embedder: spec}`; a spec is `{ClassName: kwargs}`, a list of specs or a function."
    )
    loss_funcs: Any = _doc("`{name: {LossClass: kwargs}}`; losses nest (`XMLWrapper: {loss: {ContrastiveLoss: {}}}`).")
    mining_funcs: Any = _doc("`{tuple_miner: {MinerClass: kwargs}}` or `{}`.")
    sampler: Any = _doc("The batch sampler, e.g. `{MPerClassSampler: {m: 4}}` (labels and batch size are filled in).")
    optimizers: Any = _doc(
        "`{<model>_optimizer: {OptimizerClass: kwargs}}`; `param_groups` and `prototype_lr` are ours."
    )
    transforms: Any = _doc("`{train: {...}, eval: {...}}` of torchvision transforms by class name.")
    tester: Any = _doc("The PML tester and its accuracy calculator.")
    aggregator: Any = _doc("How the folds' validation metrics become one number (the search objective).")
    ensemble: Any = _doc("How the folds' models are combined for the test.")
    hook_container: Any = _doc("`primary_metric` (selects the best epoch, drives patience) and PB's hook settings.")
    factories: Any = _doc("powerful-benchmarker's factory names; only the defaults are accepted.")
    dataset: Any = _doc("`{DatasetClass: kwargs}` or a dataset by name `{name: glyphs, root: ..., kwargs: {...}}`.")
    splits_to_eval: Any = _doc(
        "The splits evaluated every `save_interval` epochs: a subset of `[train, val]` with `val`."
    )
    split_manager: Any = _doc("The class-disjoint split and its folds.")
    seed: Any = setting(0, "Seeds the global RNGs at each fold start (`seed + fold`); `null` leaves them alone.")
    device: Any = setting("auto", "`auto` (CUDA when present), `cpu`, `cuda` or `cuda:N`.")
    normalize: Any = _doc(
        "The `Normalize` appended to the transforms, `{mean: [...], std: [...]}` (default ImageNet's)."
    )
    dataset_root: Any = _doc("Folder given to dataset classes that take `root`.")
    test_hooks: Any = _doc("`{name: {HookClass: kwargs}}` run once on the test split with fold 0's best model.")
    prototype_init: Any = _doc("Initialise the trunk's `HistogramPooling` prototypes from training images.")
    skip_bad_images: Any = setting(
        None, "`true` leaves out the image files that do not decode instead of stopping.", "bool"
    )
    feature_cache: Any = _doc("Train the trunk's rest on cached outputs of its frozen prefix.")


class MLRC(Protocol):
    """powerful-benchmarker's metric-learning reality check on a merged PB config (docs/runner.md)."""

    name = "mlrc"
    description = "Metric Learning Reality Check: class-disjoint folds, early stopping, separate + concatenated test"
    Settings = Settings

    @classmethod
    def keys(cls):
        return super().keys() + OLD_TOP_LEVEL_KEYS

    @classmethod
    def normalize(cls, config, sources, log=None):
        """powerful-benchmarker's pre-0.9.29 spellings mapped onto today's keys (:mod:`.old_keys`)."""
        return map_old_keys(config, sources, log=log)

    @classmethod
    def check(cls, config, sources=None):
        super().check(config, sources)
        pb_keys.check_values(config, sources)

    @classmethod
    def data_folder(cls, path: str, is_csv: bool, columns=None) -> Dict[str, Any]:
        """Your images, every class (``ImageCSVSplit`` or ``ImageFolderSplit``); the protocol makes its own
        class-disjoint split unless the CSV has a split column: then its test rows' classes (:func:`csv_split_classes`)
        are ``split_manager``'s ``test_classes``, and a ConfigError refuses test classes that training rows share."""
        if not is_csv:
            return {"dataset~OVERRIDE~": {"ImageFolderSplit": {"root": path, "split": "all"}}}
        kwargs = {"csv_file": path, "split": "all", **({"columns": columns} if columns else {})}
        update = {"dataset~OVERRIDE~": {"ImageCSVSplit": kwargs}}
        split = csv_split_classes(path, columns or {})
        if split is None:
            return update
        train, test, column = split
        shared = sorted(set(train) & set(test))
        if shared:
            shown = ", ".join(shared[:5]) + (f", ... ({len(shared)})" if len(shared) > 5 else "")
            kept = ",".join(f"{k}={v}" for k, v in (columns or {}).items() if k != "split") or "label=LABEL,path=PATH"
            raise ConfigError(
                f"command line: --data_folder {path}: its {column!r} column puts {len(shared)} "
                f"classes in both the training and the test rows ({shown}); the mlrc protocol tests on classes it "
                f"never trained on: make the split class-disjoint, or map no split column (--columns {kept}) and mlrc "
                "splits the classes itself, or run a paired config with class_overlap: allowed in the dataset's kwargs "
                "(same-class retrieval)"
            )
        update["split_manager"] = {"ClassDisjointSplitManager": {"test_classes": sorted(test)}}
        return update

    @classmethod
    def objective(cls, results: Dict[str, Any], config: Dict[str, Any]) -> float:
        """The aggregated validation primary metric (mean over folds of the best epoch's value)."""
        primary = pb_keys.primary_metric(config)
        aggregate = results.get("aggregate") or {}
        if primary in aggregate:
            return float(aggregate[primary])
        folds = [f.get(f"best_val_{primary}") for f in results.get("folds") or []]
        if folds and all(isinstance(v, (int, float)) for v in folds):
            return float(sum(folds) / len(folds))
        raise ConfigError(f"bayes_opt_iters: the mlrc run reports no validation {primary} to optimise")

    @functools.cached_property
    def runner(self):
        """The run (:class:`.runner.MLRCRunner`), built on first use (it imports torch)."""
        from .runner import MLRCRunner

        return MLRCRunner(self.config, self.folder, self.sources, self.log)

    def preflight(self) -> None:
        self.runner.prepare()

    def run(self) -> Dict[str, Any]:
        return self.runner.run()


PROTOCOL = MLRC
