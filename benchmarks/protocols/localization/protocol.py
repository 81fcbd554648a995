"""The ``localization`` protocol (a runner plugin, ``protocol: benchmarks.protocols.localization``): explanation maps of
metric-learning models scored as weakly supervised localisation,
paired over seeds (Zhu, Yang & Chen, "Visual Explanation for Deep Metric Learning", TIP 2021, Sec. VI-A/B, Tables
I-IV).

Per seed ``s`` of ``seeds``: the training, test and held-out composites are drawn (``dataset`` / ``test_dataset`` /
``validation_dataset``, e.g. :class:`~pml_extensions.explain.CompositeLocalizationDataset`: drawings pasted on photos
with exact boxes; the test classes are unseen; ``dataset_seed: {train: 1000, test: 2000, validation: 3000}`` gives
each split's dataset the seed ``offset + s``, so every seed draws its own composites, and the held-out ones are drawn
independently of the test ones). The held-out composites choose each method's threshold and the centre box's side
fraction; the test composites are scored at that choice. Every entry of ``variants`` (merged over the config; e.g.
``ms`` with the Multi-Similarity loss, the paper's recipe, and ``triplet``) is fine-tuned on the training composites
(:mod:`.training`: the same initial weights and batches for every variant of a seed) and then measured on the test
composites (:mod:`.maps`): every explanation method under both sign conventions, the localisation accuracy per
threshold, at the threshold chosen on the held-out composites (``held_out_accuracy``) and at the test images' own best
threshold (``best_accuracy``, optimistic), P@1 on the training and the test classes, the rectified Grad-CAM identity.

Statistics (:mod:`pml_extensions.runner.outputs.results`, paired by seed, 95 % t intervals):

- ``variants`` / ``comparisons``: per variant and seed, ``train_p_at_1``, ``test_p_at_1`` and the held-out-threshold
  localisation accuracy of every method and convention (``"Decomposition [signed]"`` ...); ``comparisons: [[triplet,
  ms]]`` on every one of them (Tables III-IV);
- ``methods``: per variant, the methods as variants (metrics ``held_out_accuracy`` and ``best_accuracy``, plus the
  centre-box baseline) with every method against Decomposition under the same convention, each method's ReLU map
  against its signed map, and every method against the centre box (Tables I-II).

Outputs under the experiment folder: ``results.json`` (the above, plus ``runs``: per seed and variant the scores,
accuracy per threshold, identity, P@1, loss at the start and the end of the fine-tuning; per seed the centre box, the
thresholds and the map size), ``results.md``, ``report.html``, ``data/seed_<s>/result.json`` and
``<variant>/seed_<s>/`` (logs, ``checkpoint.pth`` per epoch, ``last_models.pth``, ``result.json``). A rerun skips
finished units and resumes an interrupted fine-tuning from its last epoch. One process (no torchrun).
"""

import copy
import dataclasses
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from pml_extensions.runner.config.specs import one_spec
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.objects.data import dataset_labels
from pml_extensions.runner.outputs.results import render_markdown, summarize, write_results
from pml_extensions.runner.protocols.base import REQUIRED, setting
from pml_extensions.runner.protocols.paired_protocol import PairedProtocol

from . import maps
from .training import train_unit

DATA_KEYS = ("dataset", "test_dataset", "validation_dataset", "dataset_seed", "transforms", "normalize")
REFERENCE = "Decomposition"
CENTRE_BOX = "centre box"
METRICS = ("held_out_accuracy", "best_accuracy")


@dataclasses.dataclass
class Settings:
    """The keys of one variant of the ``localization`` protocol."""

    dataset: Any = setting(REQUIRED, "The training composites, one `{ClassName: kwargs}`.")
    test_dataset: Any = setting(REQUIRED, "The test composites (unseen classes), one `{ClassName: kwargs}`.")
    validation_dataset: Any = setting(
        REQUIRED,
        "The held-out composites that choose each method's threshold and the centre box's side, one "
        "`{ClassName: kwargs}` (same image size as the test composites).",
    )
    models: Dict[str, Any] = setting(REQUIRED, "`{trunk, embedder}` specs.", "mapping")
    loss_funcs: Dict[str, Any] = setting(REQUIRED, "`{name: {LossClass: kwargs}}`.", "mapping")
    optimizers: Dict[str, Any] = setting(REQUIRED, "`{<model>_optimizer: {OptimizerClass: kwargs}}`.", "mapping")
    num_epochs: int = setting(REQUIRED, "Fine-tuning epochs.", "int", minimum=1)
    iterations_per_epoch: int = setting(REQUIRED, "Iterations per epoch.", "int", minimum=1)
    batch_size: int = setting(32, "Training batch size.", "int", minimum=1)
    eval_batch_size: int = setting(32, "Batch size of the map passes.", "int", minimum=1)
    dataset_seed: Dict[str, int] = setting(
        {}, "`{train: 1000, test: 2000, validation: 3000}`: seed `offset + s` per split.", "mapping"
    )
    transforms: Any = setting(None, "`{train: ..., eval: ...}` torchvision transforms.")
    normalize: Any = setting(None, "The `Normalize` appended to the transforms.")
    frozen_prefix: Any = setting(None, "A trunk boundary: the trunk up to it is frozen.")
    mining_funcs: Any = setting({}, "`{name: {MinerClass: kwargs}}`.", optional=True)
    sampler: Any = setting(None, "The batch sampler.")
    trainer: Any = setting(None, "The PML trainer (default `MetricLossOnly`).")


def _stack(view) -> torch.Tensor:
    return torch.stack([view[i][0] for i in range(len(view))])


def method_statistics(runs: Dict[Any, Dict[str, Any]], seeds: List[int], variant: str) -> Dict[str, Any]:
    """Tables I-II's statistics of one variant: every method and convention (and the centre box) as a variant with
    the metrics :data:`METRICS` (``held_out_accuracy``: the test accuracy at the threshold, or side fraction, chosen
    on the held-out composites; ``best_accuracy``: at the test images' own best one); every method against
    Decomposition under the same convention, each method's ReLU map against its signed map, and every method against
    the centre box (:func:`pml_extensions.runner.outputs.results.summarize`)."""
    per: Dict[str, Dict[Any, Dict[str, float]]] = {}
    for s in seeds:
        for k, v in runs[s]["losses"][variant]["scores"].items():
            per.setdefault(k, {})[s] = {m: v[m] for m in METRICS}
    per[CENTRE_BOX] = {s: {m: runs[s]["centre_box"][m] for m in METRICS} for s in seeds}
    pairs = []
    for conv in maps.CONVENTIONS:
        base = maps.score_name(REFERENCE, conv)
        pairs += [(k, base) for k in per if k.endswith(f"[{conv}]") and k != base]
    pairs += [(maps.score_name(m, "ReLU"), maps.score_name(m, "signed")) for m in maps.METHODS]
    pairs += [(k, CENTRE_BOX) for k in per if k != CENTRE_BOX]
    return summarize(per, comparisons=pairs, metrics=list(METRICS))


def variant_statistics(
    units: Dict[Any, Dict[str, Any]], seeds: List[int], comparisons, extra: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """Tables III-IV's statistics: per variant and seed ``train_p_at_1``, ``test_p_at_1`` and the localisation
    accuracy of every method and convention at the threshold chosen on the held-out composites; ``comparisons``
    (``[(variant, baseline)]``) on every one of them (:func:`pml_extensions.runner.outputs.results.summarize`;
    ``extra`` goes into the dict)."""
    names = list(units[seeds[0]])
    metrics = ["train_p_at_1", "test_p_at_1"] + list(units[seeds[0]][names[0]]["scores"])
    per_seed = {
        name: {
            s: {
                "train_p_at_1": units[s][name]["train_p_at_1"],
                "test_p_at_1": units[s][name]["test_p_at_1"],
                **{k: v["held_out_accuracy"] for k, v in units[s][name]["scores"].items()},
            }
            for s in seeds
        }
        for name in names
    }
    return summarize(per_seed, comparisons=comparisons, metrics=metrics, extra=extra)


class Localization(PairedProtocol):
    """Explanation maps of metric-learning models scored as weakly supervised localisation (module docstring)."""

    name = "localization"
    description = "explanation maps localise objects: methods x sign conventions, MS vs Triplet, paired seeds"
    Settings = Settings

    def __init__(self, config, folder, sources=None, log=print):
        super().__init__(config, folder, sources, log)
        self.first = next(iter(self.variant_configs.values()))
        self._data: Dict[int, Dict[str, Any]] = {}

    @classmethod
    def check(cls, config, sources=None):
        super().check(config, sources)
        configs, _, where = cls.variants(config, sources)
        first = next(iter(configs.values()))
        for name, v in configs.items():
            changed = [k for k in DATA_KEYS if v.get(k) != first.get(k)]
            if changed:
                raise ConfigError(
                    f"{where[name].get(changed[0], 'config')}: {changed[0]} must be the same in every variant (the "
                    "seed's data is shared)"
                )
        if set(first.get("dataset_seed") or {}) - {"train", "test", "validation"}:
            where0 = (sources or {}).get("dataset_seed", "config")
            raise ConfigError(f"{where0}: dataset_seed: expected {{train: 1000, test: 2000, validation: 3000}}")

    def data(self, seed: int) -> Dict[str, Any]:
        """The seed's training view, training, test and held-out images (evaluation transform) and the test and
        held-out datasets; writes the seed's data facts (centre box, thresholds) to ``data/seed_<s>/result.json`` the
        first time."""
        if seed not in self._data:
            cfg = self.first
            b = Builder(cfg, self.sources, self.device, self.log)
            offsets = cfg.get("dataset_seed") or {}

            def spec(key, split):
                s = cfg[key]
                return with_kwargs(s, seed=int(offsets[split]) + seed) if split in offsets else s

            train_set = b.build_dataset(spec=spec("dataset", "train"))
            test_set = b.build_dataset(spec=spec("test_dataset", "test"), key="test_dataset")
            validation_set = b.build_dataset(spec=spec("validation_dataset", "validation"), key="validation_dataset")
            train_labels = dataset_labels(train_set)
            idx = np.arange(len(train_set))
            eval_tf = b.build_transform("eval")
            d = {
                "train": b.subset(train_set, idx, train_labels, b.build_transform("train")),
                "train_images": _stack(b.subset(train_set, idx, train_labels, eval_tf)),
                "train_labels": train_labels,
                "test_images": _stack(b.subset(test_set, np.arange(len(test_set)), dataset_labels(test_set), eval_tf)),
                "test_set": test_set,
                "validation_images": _stack(
                    b.subset(validation_set, np.arange(len(validation_set)), dataset_labels(validation_set), eval_tf)
                ),
                "validation_set": validation_set,
            }
            size = (int(d["test_images"].shape[-2]), int(d["test_images"].shape[-1]))
            stage = f"data/seed_{seed}"
            if self.exp.stage_result(stage) is None:
                self.exp.finish_stage(
                    stage,
                    {
                        "centre_box": maps.centre_box(test_set, size, validation_set),
                        "thresholds": maps.thresholds(),
                        "n_train": len(train_set),
                        "n_test": len(test_set),
                        "n_validation": len(validation_set),
                        "image_size": list(size),
                    },
                )
            self._data[seed] = d
        return self._data[seed]

    def unit(self, settings, variant, seed, folder, builder):
        cfg, d = self.variant_configs[variant], self.data(seed)
        start = time.time()
        r = train_unit(variant, cfg, seed, folder, d["train"], self.device, self.log, self.sources)
        trunk, embedder = r["models"]["trunk"], r["models"]["embedder"]
        measured = maps.measure(
            trunk,
            embedder,
            d["test_images"],
            d["test_set"],
            self.device,
            settings.eval_batch_size,
            d["validation_images"],
            d["validation_set"],
            prefix=cfg.get("frozen_prefix"),
        )
        result = {
            **measured,
            "train_p_at_1": maps.p_at_1(maps.embed(trunk, embedder, d["train_images"], self.device), d["train_labels"]),
            "loss_start": r["loss_start"],
            "loss_end": r["loss_end"],
            "train_seconds": r["train_seconds"],
            "seconds": time.time() - start,
        }
        self.log(
            f"seed {seed} {variant}: {result['seconds']:.0f}s, loss {result['loss_start']:.3f} -> "
            f"{result['loss_end']:.3f}, P@1 train {result['train_p_at_1']:.1f} test {result['test_p_at_1']:.1f}; "
            + ", ".join(f"{k}: {v['held_out_accuracy']:.1f}" for k, v in result["scores"].items())
        )
        return result

    def run(self) -> Dict[str, Any]:
        """Fine-tune and measure every variant at every seed (resuming what is there), compare, write
        ``results.json`` and ``results.md``; returns the results dict (see the module docstring)."""
        start = time.time()
        by_variant = self.run_units()
        seeds, names = self.settings.seeds, list(self.variant_configs)
        units = {seed: {name: by_variant[name][seed] for name in names} for seed in seeds}
        runs = {}
        for seed in seeds:
            facts = self.exp.stage_result(f"data/seed_{seed}")
            if facts is None:  # written with the seed's first unit; rebuilt if it went missing
                self.data(seed)
                facts = self.exp.stage_result(f"data/seed_{seed}")
            runs[seed] = {
                "losses": units[seed],
                "centre_box": facts["centre_box"],
                "thresholds": facts["thresholds"],
                "feature_size": units[seed][names[0]]["feature_size"],
                "n_train": facts["n_train"],
                "n_test": facts["n_test"],
                "n_validation": facts["n_validation"],
                "image_size": facts["image_size"],
            }
        first = self.first
        results = variant_statistics(
            units,
            seeds,
            self.settings.comparisons,
            extra={
                "protocol": self.name,
                "seeds": seeds,
                "device": str(self.device),
                "dataset": first["dataset"],
                "test_dataset": first["test_dataset"],
                "validation_dataset": first["validation_dataset"],
                "num_epochs": first["num_epochs"],
                "iterations_per_epoch": first["iterations_per_epoch"],
                "batch_size": first.get("batch_size", 32),
                "methods": {name: method_statistics(runs, seeds, name) for name in names},
                "runs": {str(s): r for s, r in runs.items()},
                "seconds_this_invocation": time.time() - start,
                "train_seconds_sum": sum(units[s][n]["train_seconds"] for s in seeds for n in names),
            },
        )
        first_run = runs[seeds[0]]
        header = (
            f"Localisation of unseen-class test composites ({first_run['n_test']} per seed at "
            f"{first_run['image_size'][0]} px -> {first_run['feature_size'][0]}×{first_run['feature_size'][1]} "
            f"maps), {first_run['n_train']} training composites, {first['num_epochs']} × "
            f"{first['iterations_per_epoch']} fine-tuning iterations; seeds {', '.join(map(str, seeds))} (paired: "
            "every variant of a seed starts from the same weights and sees the same batches). Localisation accuracy "
            "(%, IoU > 0.5) of every method and sign convention at the threshold chosen on "
            f"{first_run['n_validation']} held-out composites per seed, P@1 (%); differences paired by seed, 95 % "
            "Student-t interval."
        )
        lines = []
        for name in names:
            lines += ["", f"Methods of `{name}` (localisation accuracy at the held-out threshold, %):", ""]
            lines.append(render_markdown(results["methods"][name], metrics=["held_out_accuracy"], decimals=1).rstrip())
        metrics = ["train_p_at_1", "test_p_at_1", "Decomposition [signed]", "Grad-CAM [ReLU]"]
        write_results(self.folder, results, metrics=metrics, header=header, footer="\n".join(lines), decimals=1)
        with open(os.path.join(self.folder, "results.md"), encoding="utf-8") as f:
            self.log(f.read())
        return results


def with_kwargs(spec: Dict[str, Any], **changes) -> Dict[str, Any]:
    """A copy of the one-entry spec ``{Name: kwargs}`` with ``changes`` merged into ``kwargs``."""
    name, kwargs = one_spec(spec, "spec")
    return {name: dict(copy.deepcopy(kwargs), **changes)}


PROTOCOL = Localization
