"""The ``mlrc`` protocol's run (:class:`MLRCRunner`; the steps: :mod:`.protocol`), apart from its settings so that
reading a config imports no torch."""

import os
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from ....utils.checks import is_int
from ...config import pb_keys
from ...config.registry import resolve
from ...config.specs import one_spec
from ...errors import ConfigError
from ...experiment import distributed as dist_utils
from ...experiment.checkpoint import load_weights
from ...experiment.epoch_loop import EpochLoop
from ...experiment.folder import Experiment, time_estimate
from ...objects import preflight
from ...objects.builder import Builder, accepts
from ...objects.data import dataset_labels
from ...objects.feature_cache import FeatureCaches, check_fixed_prefix, end_of_epoch_hook, subset_key
from ...outputs.retrieval import dataset_image, save_retrieval_examples
from .splits import ensemble_metrics, mlrc_class_splits

__all__ = ["MLRCRunner"]


class MLRCRunner:
    """Run one experiment of the MLRC protocol from a merged config; ``run()`` returns (and writes to
    ``results.json``) the per-fold validation summary and the test metrics.

    Args:
        config: the merged dict from :func:`pml_extensions.runner.protocols.load_config`.
        experiment_folder: output folder; rerunning with the same folder resumes.
        sources: top-level key -> file, to name the file in error messages.
        log: a print-like function.

    Raises:
        ConfigError: one line naming the file and key for unknown classes, bad keywords and invalid values.
    """

    def __init__(
        self,
        config: Dict[str, Any],
        experiment_folder: str,
        sources: Optional[Dict[str, str]] = None,
        log: Callable[[str], None] = print,
    ):
        self.config = config
        self.folder = experiment_folder
        self.experiment = Experiment(experiment_folder, config, sources, log)
        self.log = self.experiment.log
        self.device = self.experiment.device
        self.builder = Builder(config, sources, self.device, self.log)
        self.where = self.builder.where
        self.get = self.builder.get
        self.sources = self.experiment.sources
        self.split = pb_keys.split_settings(config, self.sources)
        self.getter = pb_keys.data_and_label_getter(self.split["data_and_label_getter_keys"])
        self.trained = False  # did this call train any epoch (then saved test numbers are stale)
        self.prepared = None  # (base, labels, splits, transforms) of prepare()
        self.caches = None  # FeatureCaches with a feature_cache key (set in run())

    # datasets: images with a transform, or the feature caches' views
    def train_view(self, base, labels, indices, transforms, seed: int = 0):
        """Items ``indices`` of ``base`` for training: the train transform, or their cached training views
        (drawn with ``seed``)."""
        if self.caches is None:
            return self.builder.subset(base, indices, labels, transforms["train"], self.getter)
        cached = self._cached("train", base, labels, self.pool, transforms["train"], seed)
        return self.builder.subset(cached, np.searchsorted(self.pool, indices))

    def eval_view(self, base, labels, indices, transforms):
        """Items ``indices`` of ``base`` for evaluation: the eval transform, or their cached eval view."""
        if self.caches is None:
            return self.builder.subset(base, indices, labels, transforms["eval"], self.getter)
        cached = self._cached("eval", base, labels, np.arange(len(labels)), transforms["eval"], 0)
        return self.builder.subset(cached, indices)

    def _cached(self, part, base, labels, indices, transform, seed):
        images = self.builder.subset(base, indices, labels, None, self.getter)
        views = self.caches.spec["num_views"] if part == "train" else 1
        try:  # the base dataset's file list (or items) and the indices
            key = subset_key(base, indices)
        except ValueError:  # a base without a labels array: the subset's items are hashed
            key = None
        return self.caches.dataset(part, self.builder.frozen, images, transform, views, seed, dataset_key=key)

    def evaluate(self, tester, dataset, models) -> Dict[str, float]:
        trunk, embedder = models["trunk"], models["embedder"]
        modes = (trunk.training, embedder.training)
        emb, labels = tester.get_all_embeddings(dataset, dist_utils.unwrap(trunk), dist_utils.unwrap(embedder))
        trunk.train(modes[0])
        embedder.train(modes[1])
        acc = tester.accuracy_calculator.get_accuracy(emb, labels[:, tester.label_hierarchy_level])
        return {k: float(v) for k, v in acc.items() if isinstance(v, (int, float))}

    # ---------------------------------------------------------------------------------------------- one fold
    def train_fold(self, fold: int, base, labels, split, transforms) -> Dict[str, Any]:
        stage = f"fold_{fold}"
        fold_dir = self.experiment.stage_folder(stage)
        splits_to_eval = pb_keys.splits_to_eval(self.config, self.sources)
        ckpt = self.experiment.checkpointer(
            stage,
            epoch_tables={f"accuracies_{s}" for s in splits_to_eval},
            **pb_keys.record_keeper_options(self.config, fold_dir, self.sources),
        )
        train_idx = np.nonzero(np.isin(labels, split["train"]))[0]
        val_idx = np.nonzero(np.isin(labels, split["val"]))[0]
        fold_seed = (self.experiment.seed or 0) + fold
        train_ds = self.train_view(base, labels, train_idx, transforms, fold_seed)
        val_ds = self.eval_view(base, labels, val_idx, transforms)
        eval_sets = {"val": val_ds}
        if "train" in splits_to_eval:
            eval_sets["train"] = self.eval_view(base, labels, train_idx, transforms)

        trainer_name, trainer_kwargs = one_spec(self.builder._require("trainer"), self.where("trainer"))
        trainer_kwargs = dict(trainer_kwargs)
        global_batch = trainer_kwargs.get("batch_size", 32)
        if global_batch % dist_utils.world_size():
            raise ConfigError(
                f"{self.where('trainer')}: batch_size {global_batch} is "
                f"not divisible by {dist_utils.world_size()} processes"
            )
        trainer_kwargs["batch_size"] = global_batch // dist_utils.world_size()

        self.experiment.seed_everything(fold)
        models = self.builder.build_models(val_ds[0][0], len(split["train"]))
        # prototypes from the training classes' images (eval transform); a resume overwrites them with the saved ones
        self.builder.init_from_data(models, self.eval_view(base, labels, train_idx, transforms), seed=fold_seed)
        loss_funcs, mining_funcs = self.builder.build_losses(models, len(split["train"]))
        optimizers = self.builder.build_optimizers(models, loss_funcs)
        sampler = self.builder.build_sampler(train_ds.labels, global_batch)
        tester = self.builder.build_tester()

        primary = pb_keys.primary_metric(self.config, self.sources)
        best_path = os.path.join(fold_dir, "best.pth")

        def evaluate(epoch):
            return {name: self.evaluate(tester, ds, models) for name, ds in eval_sets.items()}

        loop = EpochLoop(
            ckpt,
            models,
            optimizers,
            loss_funcs,
            num_epochs=self.get("num_epochs_train", 1000),
            primary=primary,
            evaluate=evaluate,
            best_path=best_path,
            patience=self.get("patience", 9),
            save_interval=int(self.get("save_interval", 1)),
            check_untrained=bool(self.get("check_untrained_accuracy", True)),
            log=self.log,
            name=f"fold {fold}",
            where=self.where("hook_container"),
        )
        loop.resume()
        if not loop.finished:
            self.trained = True
        epoch_hook = lambda trainer: True  # noqa: E731
        if self.caches is not None:  # epoch e trains on the views drawn for e completed epochs
            train_ds.dataset.set_epoch(loop.start_epoch - 1)
            epoch_hook = end_of_epoch_hook(train_ds.dataset)

        def make_trainer():
            return self.builder.build_trainer(
                {trainer_name: trainer_kwargs},
                models=dist_utils.wrap_models(models, self.device),
                optimizers=optimizers,
                loss_funcs=dist_utils.wrap_losses(loss_funcs),
                mining_funcs=mining_funcs,
                dataset=train_ds,
                dataset_labels=train_ds.labels,
                sampler=sampler,
                data_device=self.device,
                end_of_iteration_hook=loop.end_of_iteration,
                end_of_epoch_hook=epoch_hook,
            )

        # A fresh sampler per epoch: PML's MPerClassSampler reorders its own label list in place, state that a
        # checkpoint would not hold; rebuilt from the (checkpointed) RNG, a resumed epoch draws the same batches.
        best = loop.run(make_trainer, lambda: self.builder.build_sampler(train_ds.labels, global_batch))
        return {
            "best_val_" + primary: best["metric"],
            "best_epoch": best["epoch"],
            "best_val_metrics": best["metrics"],
            "best_path": best_path,
            "val_classes": split["val"],
            "train_classes": split["train"],
        }

    # ---------------------------------------------------------------------------------------------- test
    def test(self, base, labels, classes, transforms, fold_results) -> Dict[str, Dict[str, float]]:
        test_idx = np.nonzero(np.isin(labels, classes))[0]
        test_ds = self.eval_view(base, labels, test_idx, transforms)
        tester = self.builder.build_tester()
        calc = tester.accuracy_calculator
        ensemble = pb_keys.ensemble_settings(self.config, self.sources)
        embeddings, y = [], None
        for k, fr in enumerate(fold_results):
            if not os.path.exists(fr["best_path"]):
                raise ConfigError(f"{self.where('check_untrained_accuracy')}: fold {k} has no evaluated model to test")
            self.experiment.seed_everything(k)
            models = self.builder.build_models(test_ds[0][0], len(fr["train_classes"]))
            for name, sd in load_weights(fr["best_path"], self.device).items():
                models[name].load_state_dict(sd)
            embedder = torch.nn.Identity() if ensemble["use_trunk_output"] else models["embedder"]
            emb, lab = tester.get_all_embeddings(test_ds, models["trunk"], embedder)
            embeddings.append(emb)
            y = lab[:, tester.label_hierarchy_level]
            if k == 0 and dist_utils.is_main():
                self.run_test_hooks(test_ds, models, fr.get("best_epoch"))
        if dist_utils.is_main():  # a few seeded test queries with their top-k, for report.html
            normalize = ensemble["normalize_embeddings"]
            raw = self.builder.subset(base, test_idx, labels, None, self.getter)
            save_retrieval_examples(
                self.folder,
                "test",
                torch.cat([torch.nn.functional.normalize(e.float(), dim=1) if normalize else e for e in embeddings], 1),
                y.cpu().numpy(),
                lambda i: dataset_image(raw, i),  # the image before any transform, also for a cached run
                seed=self.experiment.seed or 0,
                class_names=getattr(base, "classes", None),
                note=f"The concatenated test model: the best checkpoints of {len(embeddings)} fold model(s), their "
                "embeddings concatenated (the `concatenated_*` row of the test metrics).",
            )
        return ensemble_metrics(
            embeddings,
            y,
            calc,
            normalize=ensemble["normalize_embeddings"],
            tester_normalize=tester.normalize_embeddings,
        )

    def run_test_hooks(self, test_ds, models, epoch: Optional[int] = None) -> None:
        """Run the config's ``test_hooks`` once on the test split with fold 0's best model, as PML
        ``end_of_testing_hook``s (``trunk``, ``embedder``, ``dataset_dict``, ``output_dir`` and ``epoch`` filled in)."""
        specs = self.get("test_hooks") or {}
        if not specs:
            return
        fills = {
            "trunk": models["trunk"],
            "embedder": models["embedder"],
            "dataset_dict": {"test": test_ds},
            "output_dir": os.path.join(self.folder, "explanations"),
            "epoch": epoch,
        }
        for key, spec in specs.items():
            name, kwargs = one_spec(spec, self.where(f"test_hooks.{key}"))
            cls = resolve(name, self.where(f"test_hooks.{key}"))
            extra = {k: v for k, v in fills.items() if k not in (kwargs or {}) and accepts(cls, k)}
            hook = self.builder.build(f"test_hooks.{key}", {name: kwargs}, **extra)
            call = getattr(hook, "end_of_testing_hook", hook)
            tester = self.builder.build_tester(end_of_testing_hook=call, sharded=False)  # rank 0 only
            tester.test({"test": test_ds}, 0, models["trunk"], models["embedder"])

    def setup_caches(self, labels, test_classes) -> None:
        """The feature caches (``feature_cache`` key): the frozen prefix (checked to be the same for every fold's
        seed), the train/val pool whose training views are cached."""
        where = self.where("feature_cache")
        if self.get("test_hooks"):
            raise ConfigError(f"{where}: test_hooks explain images with the whole trunk; run them without a cache")
        seed = self.experiment.seed or 0
        check_fixed_prefix(lambda: Builder(self.config, self.sources, self.device, self.log), [seed], where)
        self.caches = FeatureCaches(self.builder, self.folder, self.log)
        self.builder.build_models()  # the frozen prefix the caches are built with (builder.frozen)
        self.pool = np.nonzero(~np.isin(labels, test_classes))[0]

    # ---------------------------------------------------------------------------------------------- all
    def prepare(self) -> None:
        """Every check before training, in one pass (:class:`~pml_extensions.runner.errors.Problems`): the dataset
        builds (its columns, its files), every image decodes, enough classes for the split and the sampler, the
        images' channels and sizes fit the trunk. Nothing is written to a folder that does not exist yet.

        Raises:
            ConfigProblems: every problem found, one line each.
        """
        from ...errors import Problems

        problems = Problems()
        base = labels = splits = None
        transforms = {}
        with problems.check():
            base = self.builder.build_dataset()
        images_ok = False
        if base is not None:
            skip = self.get("skip_bad_images", False)
            folder = self.folder if os.path.isdir(self.folder) else None  # a rerun keeps its record of good files
            with problems.check():
                base = preflight.check_images(base, folder, skip is True, self.where("dataset"), self.log)
                images_ok = True
            with problems.check():
                labels = pb_keys.label_level(
                    dataset_labels(base), self.split["hierarchy_level"], self.where("split_manager")
                )
        num_sets = int(self.split["num_training_sets"])
        test_classes = None
        if labels is not None and self.split["test_classes"] is not None:
            with problems.check():
                test_classes = self.test_class_labels(base, labels, self.split["test_classes"])
        if labels is not None and (self.split["test_classes"] is None or test_classes is not None):
            with problems.check():
                splits = preflight.class_splits(
                    self.builder,
                    labels,
                    lambda ls, parts: mlrc_class_splits(
                        ls, float(self.split["test_size"]), float(self.split["test_start_idx"]), parts, test_classes
                    ),
                    int(self.split["num_training_partitions"]),
                    num_sets,
                )
        with problems.check():
            transforms = {"train": self.builder.build_transform("train"), "eval": self.builder.build_transform("eval")}
            if images_ok:  # the channels are read from the images: only once every image decodes
                classes = len(splits["folds"][0]["train"]) if splits else 2
                transforms = preflight.fit_channels(self.builder, base, transforms, classes, self.getter, self.log)
        if splits is not None:
            with problems.check():
                batch = one_spec(self.builder._require("trainer"), self.where("trainer"))[1].get("batch_size", 32)
                folds = splits["folds"][:num_sets]
                preflight.check_sampler(self.builder, [labels[np.isin(labels, f["train"])] for f in folds], batch)
        problems.raise_any()
        self.prepared = (base, labels, splits, transforms)

    def test_class_labels(self, base, labels, wanted) -> List[int]:
        """``split_manager``'s ``test_classes`` (names as the dataset's ``classes`` write them, or labels) as labels.

        Raises:
            ConfigError: a class the dataset does not have (with the nearest name).
        """
        import difflib

        names = [str(n) for n in (getattr(base, "classes", None) or [])]
        present = {int(v) for v in np.unique(labels)}
        out, where = [], self.where("split_manager") + ".ClassDisjointSplitManager.test_classes"
        for w in wanted:
            if isinstance(w, str) and w in names:
                out.append(names.index(w))
            elif is_int(w) and w in present:
                out.append(w)
            else:
                close = difflib.get_close_matches(str(w), names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the classes: {', '.join(names[:12])}"
                raise ConfigError(f"{where}: the dataset has no class {w!r}{hint}")
        return out

    def class_names(self, base, classes) -> List[str]:
        """The names of ``classes`` (labels) as the dataset writes them (its ``classes``), else the labels."""
        names = getattr(base, "classes", None)
        return [str(names[c]) if names is not None and 0 <= c < len(names) else str(c) for c in classes]

    def run(self) -> Dict[str, Any]:
        t0 = time.time()
        if self.prepared is None:
            self.prepare()
        base, labels, splits, transforms = self.prepared
        preflight.record_checked_images(base, self.folder)  # a rerun decodes only new or changed files
        num_sets = int(self.split["num_training_sets"])
        if self.get("feature_cache") is not None:
            self.setup_caches(labels, splits["test"])
        names = self.class_names(base, splits["test"])
        shown = ", ".join(names[:6]) + (f", ... ({len(names)})" if len(names) > 6 else "")
        epochs, patience = self.get("num_epochs_train", 1000), self.get("patience", 9)
        stops = (
            "no early stopping: patience null"
            if patience is None
            else f"a fold stops once {_count(int(patience) + 1, 'epoch')} pass without a better validation (patience "
            f"{patience})"
        )
        self.log(
            f"{len(labels)} items, {len(np.unique(labels))} classes; test classes: {shown}; {_count(num_sets, 'fold')} "
            f"of at most {_count(epochs, 'epoch')} ({stops})"
        )
        fold_results = []
        for k in range(num_sets):
            start, trained = time.time(), self.trained
            fold_results.append(self.train_fold(k, base, labels, splits["folds"][k], transforms))
            if self.trained and not trained and k + 1 < num_sets:  # the first fold this call trained
                took = time.time() - start
                self.log(f"one fold took {'; '.join(time_estimate(took, num_sets - k - 1))} for the rest")
        # PB's skip_ensemble_eval_if_already_done, only when no fold trained in this call
        test = None if self.trained else pb_keys.reuse_test_results(self.config, self.folder, self.sources)
        if test is None:
            test = self.test(base, labels, splits["test"], transforms, fold_results)
        results = {
            "experiment_folder": os.path.abspath(self.folder),
            "primary_metric": pb_keys.primary_metric(self.config, self.sources),
            "aggregate": pb_keys.aggregate(self.config, [f["best_val_metrics"] for f in fold_results], self.sources),
            "folds": fold_results,
            "test": test,
            "test_classes": splits["test"],
            "test_class_names": names,
            "seconds": time.time() - t0,
        }
        self.experiment.write_results(results)
        return results


def _count(n: int, word: str) -> str:
    """``"1 epoch"``, ``"3 epochs"``."""
    return f"{n} {word}{'' if n == 1 else 's'}"
