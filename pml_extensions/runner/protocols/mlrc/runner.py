"""The ``mlrc`` protocol's run, class-disjoint split and test numbers (Musgrave, Belongie & Lim, "A Metric Learning
Reality Check", ECCV 2020, Sec. 4; the steps: docs/runner.md)."""

import difflib
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ....datasets.class_disjoint_dataset import mlrc_class_splits
from ....knn.metrics import ensemble_metrics
from ...config import pb_keys
from ...config.specs import one_spec
from ...errors import ConfigError, Problems
from ...experiment import distributed as dist_utils
from ...experiment.checkpoint import load_weights_into
from ...experiment.folder import Experiment, time_estimate
from ...objects import preflight
from ...objects.builder import Builder, accepts
from ...objects.data import dataset_labels
from ...objects.feature_cache import FeatureCaches, check_fixed_prefix, subset_key
from ...outputs.retrieval import dataset_image, save_retrieval_examples

__all__ = ["MLRCRunner", "ensemble_metrics", "mlrc_class_splits"]


class MLRCRunner:
    """One experiment of the MLRC protocol; ``run()`` returns (and writes to ``results.json``) the per-fold
    validation summary and the test metrics.

    Args:
        config: the merged dict from :func:`pml_extensions.runner.protocols.load_config`.
        experiment_folder: output folder; rerunning with the same folder resumes.
        sources: top-level key -> file, to name the file in error messages.
        log: a print-like function.
    """

    def __init__(self, config: Dict[str, Any], experiment_folder: str, sources=None, log=print):
        self.config, self.folder = config, experiment_folder
        self.experiment = Experiment(experiment_folder, config, sources, log)
        self.log, self.device, self.sources = self.experiment.log, self.experiment.device, self.experiment.sources
        self.builder = Builder(config, sources, self.device, self.log)
        self.where, self.get = self.builder.where, self.builder.get
        self.split = pb_keys.split_settings(config, self.sources)
        self.getter = pb_keys.data_and_label_getter(self.split["data_and_label_getter_keys"])
        self.trained = False  # did this call train any epoch (then saved test numbers are stale)
        self.prepared = self.caches = None  # prepare()'s (base, labels, splits, transforms); run()'s FeatureCaches

    def view(self, part: str, base, labels, indices, transforms, seed: int = 0):
        """Items ``indices`` of ``base`` with the ``part`` transform, or their cached views (drawn with ``seed``)."""
        if self.caches is None:
            return self.builder.subset(base, indices, labels, transforms[part], self.getter)
        pool = self.pool if part == "train" else np.arange(len(labels))
        images = self.builder.subset(base, pool, labels, None, self.getter)
        try:  # the base dataset's file list (or items) and the indices
            key = subset_key(base, pool)
        except ValueError:  # a base without a labels array: the subset's items are hashed
            key = None
        views = self.caches.spec["num_views"] if part == "train" else 1
        cached = self.caches.dataset(part, self.builder.frozen, images, transforms[part], views, seed, dataset_key=key)
        return self.builder.subset(cached, np.searchsorted(pool, indices))

    def evaluate(self, tester, dataset, models) -> Dict[str, float]:
        emb, labels = tester.get_all_embeddings(dataset, models["trunk"], models["embedder"])  # leaves them in eval()
        acc = tester.accuracy_calculator.get_accuracy(emb, labels[:, tester.label_hierarchy_level])
        return {k: float(v) for k, v in acc.items() if isinstance(v, (int, float))}

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
        train_ds = self.view("train", base, labels, train_idx, transforms, fold_seed)
        val_ds = self.view("eval", base, labels, val_idx, transforms)
        train_eval = self.view("eval", base, labels, train_idx, transforms)
        eval_sets = {"val": val_ds, **({"train": train_eval} if "train" in splits_to_eval else {})}
        self.experiment.seed_everything(fold)
        models = self.builder.build_models(val_ds[0][0], len(split["train"]))
        # prototypes from the training classes' images (eval transform); a resume overwrites them with the saved ones
        self.builder.init_from_data(models, train_eval, seed=fold_seed)
        loss_funcs, mining_funcs = self.builder.build_losses(models, len(split["train"]))
        tester = self.builder.build_tester()

        primary = pb_keys.primary_metric(self.config, self.sources)
        best_path = os.path.join(fold_dir, "best.pth")
        loop = self.builder.train(
            ckpt,
            models,
            loss_funcs,
            mining_funcs,
            train_ds,
            self.batch_size(),
            batch_where=self.where("trainer.batch_size"),
            views=train_ds.dataset if self.caches is not None else None,
            num_epochs=self.get("num_epochs_train", 1000),
            primary=primary,
            evaluate=lambda epoch: {name: self.evaluate(tester, ds, models) for name, ds in eval_sets.items()},
            best_path=best_path,
            patience=self.get("patience", 9),
            save_interval=int(self.get("save_interval", 1)),
            check_untrained=bool(self.get("check_untrained_accuracy", True)),
            log=self.log,
            name=f"fold {fold}",
            where=self.where("hook_container"),
        )
        self.trained = self.trained or loop.trained
        best = loop.best
        return {
            "best_val_" + primary: best["metric"],
            "best_epoch": best["epoch"],
            "best_val_metrics": best["metrics"],
            "best_path": best_path,
            "val_classes": split["val"],
            "train_classes": split["train"],
        }

    def test(self, base, labels, classes, transforms, fold_results) -> Dict[str, Dict[str, float]]:
        test_idx = np.nonzero(np.isin(labels, classes))[0]
        test_ds = self.view("eval", base, labels, test_idx, transforms)
        tester = self.builder.build_tester()
        ensemble = pb_keys.ensemble_settings(self.config, self.sources)
        normalize = ensemble["normalize_embeddings"]
        embeddings = []
        for k, fr in enumerate(fold_results):
            if not os.path.exists(fr["best_path"]):
                raise ConfigError(f"{self.where('check_untrained_accuracy')}: fold {k} has no evaluated model to test")
            self.experiment.seed_everything(k)
            models = self.builder.build_models(test_ds[0][0], len(fr["train_classes"]))
            load_weights_into(models, fr["best_path"], self.device)
            embedder = torch.nn.Identity() if ensemble["use_trunk_output"] else models["embedder"]
            emb, lab = tester.get_all_embeddings(test_ds, models["trunk"], embedder)
            embeddings.append(emb)
            y = lab[:, tester.label_hierarchy_level]
            if k == 0 and dist_utils.is_main():
                self.run_test_hooks(test_ds, models, fr.get("best_epoch"))
        if dist_utils.is_main():  # a few seeded test queries with their top-k, for report.html
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
        return ensemble_metrics(embeddings, y, tester.accuracy_calculator, normalize, tester.normalize_embeddings)

    def run_test_hooks(self, test_ds, models, epoch: Optional[int] = None) -> None:
        """The config's ``test_hooks`` as PML ``end_of_testing_hook``s, their objects filled in."""
        fills = {"trunk": models["trunk"], "embedder": models["embedder"], "dataset_dict": {"test": test_ds}}
        fills.update(output_dir=os.path.join(self.folder, "explanations"), epoch=epoch)
        for key, spec in (self.get("test_hooks") or {}).items():
            name, cls, kwargs = self.builder._class_spec(f"test_hooks.{key}", spec)
            extra = {k: v for k, v in fills.items() if k not in kwargs and accepts(cls, k)}
            hook = self.builder.build(f"test_hooks.{key}", {name: kwargs}, **extra)
            call = getattr(hook, "end_of_testing_hook", hook)
            tester = self.builder.build_tester(end_of_testing_hook=call, sharded=False)  # rank 0 only
            tester.test({"test": test_ds}, 0, models["trunk"], models["embedder"])

    def setup_caches(self, labels, test_classes) -> None:
        """The ``feature_cache``: its frozen prefix (the same for every fold's seed) and the train/val pool."""
        where = self.where("feature_cache")
        if self.get("test_hooks"):
            raise ConfigError(f"{where}: test_hooks explain images with the whole trunk; run them without a cache")
        seed = self.experiment.seed or 0
        check_fixed_prefix(lambda: Builder(self.config, self.sources, self.device, self.log), [seed], where)
        self.caches = FeatureCaches(self.builder, self.folder, self.log)
        self.builder.build_models()  # the frozen prefix the caches are built with (builder.frozen)
        self.pool = np.nonzero(~np.isin(labels, test_classes))[0]

    def prepare(self) -> None:
        """Every check before training (dataset, images, classes for the split and the sampler, channels and sizes for
        the trunk), all problems in one ConfigProblems; nothing is written to a folder that does not exist yet."""
        base = labels = splits = None
        transforms, images_ok, problems = {}, False, Problems()
        with problems.check():
            base = self.builder.build_dataset()
        if base is not None:
            folder = self.folder if os.path.isdir(self.folder) else None  # a rerun keeps its record of good files
            with problems.check():
                skip = self.get("skip_bad_images", False) is True
                base = preflight.check_images(base, folder, skip, self.where("dataset"), self.log)
                images_ok = True
            with problems.check():
                labels = dataset_labels(base)
                labels = pb_keys.label_level(labels, self.split["hierarchy_level"], self.where("split_manager"))
        num_sets, wanted = int(self.split["num_training_sets"]), self.split["test_classes"]
        if labels is not None:
            with problems.check():
                test_classes = None if wanted is None else self.test_class_labels(base, labels, wanted)
                size, start = self.split["test_size"], self.split["test_start_idx"]
                split = lambda ls, parts: mlrc_class_splits(ls, size, start, parts, test_classes)  # noqa: E731
                partitions = self.split["num_training_partitions"]
                splits = preflight.class_splits(self.builder, labels, split, partitions, num_sets)
        with problems.check():
            transforms = {"train": self.builder.build_transform("train"), "eval": self.builder.build_transform("eval")}
            if images_ok:  # the channels are read from the images: only once every image decodes
                classes = len(splits["folds"][0]["train"]) if splits else 2
                transforms = preflight.fit_channels(self.builder, base, transforms, classes, self.getter, self.log)
        if splits is not None:
            with problems.check():
                folds = splits["folds"][:num_sets]
                batch = self.batch_size()
                preflight.check_sampler(self.builder, [labels[np.isin(labels, f["train"])] for f in folds], batch)
        problems.raise_any()
        self.prepared = (base, labels, splits, transforms)

    def batch_size(self) -> int:
        """The global ``batch_size`` of the config's ``trainer`` (default 32)."""
        return one_spec(self.builder._require("trainer"), self.where("trainer"))[1].get("batch_size", 32)

    def test_class_labels(self, base, labels, wanted) -> List[int]:
        """``split_manager``'s ``test_classes`` (names as the dataset's ``classes`` write them, or labels) as labels;
        ConfigError for a class the dataset does not have (with the nearest name)."""
        names = [str(n) for n in (getattr(base, "classes", None) or [])]
        label = {int(v): int(v) for v in np.unique(labels)} | {n: i for i, n in reversed(list(enumerate(names)))}
        for w in wanted:
            if isinstance(w, bool) or w not in label:
                close = difflib.get_close_matches(str(w), names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the classes: {', '.join(names[:12])}"
                where = self.where("split_manager") + ".ClassDisjointSplitManager.test_classes"
                raise ConfigError(f"{where}: the dataset has no class {w!r}{hint}")
        return [label[w] for w in wanted]

    def run(self) -> Dict[str, Any]:
        t0 = time.time()
        if self.prepared is None:
            self.prepare()
        base, labels, splits, transforms = self.prepared
        preflight.record_checked_images(base, self.folder)  # a rerun decodes only new or changed files
        num_sets = int(self.split["num_training_sets"])
        if self.get("feature_cache") is not None:
            self.setup_caches(labels, splits["test"])
        known = getattr(base, "classes", None)  # the test classes' names as the dataset writes them, else the labels
        names = [str(known[c]) if known is not None and 0 <= c < len(known) else str(c) for c in splits["test"]]
        shown = ", ".join(names[:6]) + (f", ... ({len(names)})" if len(names) > 6 else "")
        epochs, patience = self.get("num_epochs_train", 1000), self.get("patience", 9)
        stops = "no early stopping: patience null"
        if patience is not None:
            stops = f"a fold stops once {_count(patience + 1, 'epoch')} pass without a better validation"
            stops += f" (patience {patience})"
        self.log(
            f"{len(labels)} items, {len(np.unique(labels))} classes; test classes: {shown}; {_count(num_sets, 'fold')} "
            f"of at most {_count(epochs, 'epoch')} ({stops})"
        )
        fold_results, timed = [], False  # timed: the first fold this call trained from its start (not resumed)
        for k in range(num_sets):
            start = time.time()
            whole = not os.path.exists(os.path.join(self.experiment.stage_folder(f"fold_{k}"), "checkpoint.pth"))
            fold_results.append(self.train_fold(k, base, labels, splits["folds"][k], transforms))
            if whole and self.trained and not timed and k + 1 < num_sets:
                timed = True
                took = time_estimate(time.time() - start, num_sets - k - 1)
                self.log(f"one fold took {'; '.join(took)} for the rest")
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
    return f"{n} {word}{'' if n == 1 else 's'}"
