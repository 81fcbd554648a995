"""The ``localization`` protocol: explanation maps of metric-learning models scored as weakly supervised localisation,
paired over seeds (Zhu, Yang & Chen, "Visual Explanation for Deep Metric Learning", TIP 2021, Sec. VI-A/B, Tables
I-IV).

Per seed ``s`` of ``seeds``: the training and test composites are drawn (``dataset`` / ``test_dataset``, e.g.
:class:`~pml_extensions.explain.CompositeLocalizationDataset`: drawings pasted on photos with exact boxes; the test
classes are unseen; ``dataset_seed: {train: 1000, test: 2000}`` gives each split's dataset the seed ``offset + s``, so
every seed draws its own composites). Every entry of ``variants`` (merged over the config; e.g. ``ms`` with the
Multi-Similarity loss, the paper's recipe, and ``triplet``) is fine-tuned on the training composites (:mod:`.training`:
the same initial weights and batches for every variant of a seed) and then measured on the test composites
(:mod:`.maps`): every explanation method under both sign conventions, the localisation accuracy per threshold and at
the best threshold, P@1 on the training and the test classes, the rectified Grad-CAM identity.

Statistics (:mod:`pml_extensions.runner.outputs.results`, paired by seed, 95 % t intervals):

- ``variants`` / ``comparisons``: per variant and seed, ``train_p_at_1``, ``test_p_at_1`` and the best localisation
  accuracy of every method and convention (``"Decomposition [signed]"`` ...); ``comparisons: [[triplet, ms]]`` on
  every one of them (Tables III-IV);
- ``methods``: per variant, the methods as variants (metric ``best_accuracy``, plus the centre-box baseline) with
  every method against Decomposition under the same convention and each method's ReLU map against its signed map
  (Tables I-II).

Outputs under the experiment folder: ``results.json`` (the above, plus ``runs``: per seed and variant the scores,
accuracy per threshold, identity, P@1, loss at the start and the end of the fine-tuning; per seed the centre box, the
thresholds and the map size), ``results.md``, ``report.html``, ``data/seed_<s>/result.json`` and
``<variant>/seed_<s>/`` (logs, ``checkpoint.pth`` per epoch, ``last_models.pth``, ``result.json``). A rerun skips
finished units and resumes an interrupted fine-tuning from its last epoch. One process (no torchrun).
"""

import copy
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

import numpy as np
import torch

from ...config.keys import PROTOCOL_KEYS, seed_list
from ...config.loader import variant_configs
from ...errors import ConfigError
from ...experiment.folder import Experiment
from ...objects.builder import Builder, with_kwargs
from ...objects.data import dataset_labels
from ...outputs.results import render_markdown, summarize, write_results
from . import maps
from .training import train_unit

CONFIG_KEYS = PROTOCOL_KEYS["localization"]
DEFAULT_SEEDS = (0, 1, 2)
REQUIRED = ("dataset", "test_dataset", "models", "loss_funcs", "optimizers", "num_epochs", "iterations_per_epoch")
DATA_KEYS = ("dataset", "test_dataset", "dataset_seed", "transforms", "normalize")
REFERENCE = "Decomposition"
__all__ = ["CONFIG_KEYS", "method_statistics", "run", "run_units", "variant_statistics"]


def settings(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """``{"seeds", "variants" (name -> merged config), "comparisons"}``, checked.

    Raises:
        ConfigError: one line naming the file and the key.
    """
    src = sources or {}
    cfg = copy.deepcopy(config)
    cfg.pop("protocol", None)
    seeds = seed_list(cfg.pop("seeds", None) or list(DEFAULT_SEEDS))
    where = f"{src.get('seeds', 'config')}: seeds"
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise ConfigError(f"{where}: must be a non-empty list of non-negative ints, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: must be distinct, got {seeds}")
    updates = {k: (v or {}) for k, v in (cfg.pop("variants", None) or {"default": {}}).items()}
    comparisons = cfg.pop("comparisons", None) or []
    for pair in comparisons:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(p in updates for p in pair)):
            raise ConfigError(
                f"{src.get('comparisons', 'config')}: comparisons: each entry must be [variant, baseline] naming "
                f"variants of {sorted(updates)}, got {pair!r}"
            )
    merged = variant_configs({**cfg, "variants": updates}, where=src.get("variants", "config"))
    first = next(iter(merged.values()))
    for name, v in merged.items():
        here = f"{src.get('variants', 'config')} (variants.{name})"
        for key in REQUIRED:
            if v.get(key) is None:
                raise ConfigError(f"{here}: missing key {key!r}")
        for key in ("num_epochs", "iterations_per_epoch", "batch_size", "eval_batch_size"):
            value = v.get(key, 32)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{here}: {key} must be a positive integer, got {value!r}")
        changed = [k for k in DATA_KEYS if v.get(k) != first.get(k)]
        if changed:
            raise ConfigError(f"{here}: {changed[0]} must be the same in every variant (the seed's data is shared)")
    offsets = first.get("dataset_seed") or {}
    if not isinstance(offsets, dict) or set(offsets) - {"train", "test"}:
        raise ConfigError(f"{src.get('dataset_seed', 'config')}: dataset_seed: expected {{train: 1000, test: 2000}}")
    return {"seeds": list(seeds), "variants": merged, "comparisons": [tuple(p) for p in comparisons]}


def _stack(view) -> torch.Tensor:
    return torch.stack([view[i][0] for i in range(len(view))])


class _Run:
    """One call's state: settings, the experiment folder, each seed's data."""

    def __init__(self, config, folder, sources, log):
        self.s = settings(config, sources)
        self.sources = sources or {}
        self.exp = Experiment(folder, {"device": config.get("device", "auto"), "seed": None}, sources, log)
        self.log, self.device = self.exp.log, self.exp.device
        self.first = next(iter(self.s["variants"].values()))
        self._data: Dict[int, Dict[str, Any]] = {}

    def data(self, seed: int) -> Dict[str, Any]:
        """The seed's training view, training and test images (evaluation transform) and test dataset; writes the
        seed's data facts (centre box, thresholds) to ``data/seed_<s>/result.json`` the first time."""
        if seed not in self._data:
            cfg = self.first
            b = Builder(cfg, self.sources, self.device, self.log)
            offsets = cfg.get("dataset_seed") or {}

            def spec(key, split):
                s = cfg[key]
                return with_kwargs(s, seed=int(offsets[split]) + seed) if split in offsets else s

            train_set = b.build_dataset(spec=spec("dataset", "train"))
            test_set = b.build_dataset(spec=spec("test_dataset", "test"), key="test_dataset")
            train_labels = dataset_labels(train_set)
            idx = np.arange(len(train_set))
            eval_tf = b.build_transform("eval")
            d = {
                "train": b.subset(train_set, idx, train_labels, b.build_transform("train")),
                "train_images": _stack(b.subset(train_set, idx, train_labels, eval_tf)),
                "train_labels": train_labels,
                "test_images": _stack(b.subset(test_set, np.arange(len(test_set)), dataset_labels(test_set), eval_tf)),
                "test_set": test_set,
            }
            size = (int(d["test_images"].shape[-2]), int(d["test_images"].shape[-1]))
            stage = f"data/seed_{seed}"
            if self.exp.stage_result(stage) is None:
                self.exp.finish_stage(
                    stage,
                    {
                        "centre_box": maps.centre_box(test_set, size),
                        "thresholds": maps.thresholds(),
                        "n_train": len(train_set),
                        "n_test": len(test_set),
                        "image_size": list(size),
                    },
                )
            self._data[seed] = d
        return self._data[seed]

    def unit(self, name: str, seed: int) -> Dict[str, Any]:
        stage = f"{name}/seed_{seed}"
        done = self.exp.stage_result(stage)
        if done is not None:
            return done
        cfg, d = self.s["variants"][name], self.data(seed)
        start = time.time()
        r = train_unit(name, cfg, seed, self.exp.stage_folder(stage), d["train"], self.device, self.log, self.sources)
        trunk, embedder = r["models"]["trunk"], r["models"]["embedder"]
        batch = int(cfg.get("eval_batch_size", 20))
        measured = maps.measure(trunk, embedder, d["test_images"], d["test_set"], self.device, batch)
        result = {
            **measured,
            "train_p_at_1": maps.p_at_1(maps.embed(trunk, embedder, d["train_images"], self.device), d["train_labels"]),
            "loss_start": r["loss_start"],
            "loss_end": r["loss_end"],
            "train_seconds": r["train_seconds"],
            "seconds": time.time() - start,
        }
        self.log(
            f"seed {seed} {name}: {result['seconds']:.0f}s, loss {result['loss_start']:.3f} -> "
            f"{result['loss_end']:.3f}, P@1 train {result['train_p_at_1']:.1f} test {result['test_p_at_1']:.1f}; "
            + ", ".join(f"{k}: {v['best_accuracy']:.1f}" for k, v in result["scores"].items())
        )
        return self.exp.finish_stage(stage, result)


def _units(state: _Run, variants=None, seeds=None) -> Dict[int, Dict[str, Any]]:
    names = list(state.s["variants"]) if variants is None else list(variants)
    chosen = list(state.s["seeds"]) if seeds is None else [int(s) for s in seeds]
    unknown = [n for n in names if n not in state.s["variants"]] + [s for s in chosen if s not in state.s["seeds"]]
    if unknown:
        raise ConfigError(f"localization: {unknown} are not variants / seeds of this config")
    return {seed: {name: state.unit(name, seed) for name in names} for seed in chosen}


def run_units(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
    variants: Optional[Iterable[str]] = None,
    seeds: Optional[Iterable[int]] = None,
) -> Dict[int, Dict[str, Any]]:
    """Fine-tune and measure (or find finished) the units of ``seeds`` × ``variants`` (default all) without writing
    ``results.json``: parts that processes share out before :func:`run` gathers them. Returns ``{seed: {variant:
    unit}}``.

    Raises:
        ConfigError: bad settings, or a variant or seed the config does not have.
    """
    return _units(_Run(config, experiment_folder, sources, log), variants, seeds)


def method_statistics(runs: Dict[Any, Dict[str, Any]], seeds: List[int], variant: str) -> Dict[str, Any]:
    """Tables I-II's statistics of one variant: every method and convention (and the centre box) as a variant with
    metric ``best_accuracy``; every method against Decomposition under the same convention, and each method's ReLU map
    against its signed map (:func:`pml_extensions.runner.outputs.results.summarize`)."""
    per: Dict[str, Dict[Any, Dict[str, float]]] = {}
    for s in seeds:
        for k, v in runs[s]["losses"][variant]["scores"].items():
            per.setdefault(k, {})[s] = {"best_accuracy": v["best_accuracy"]}
    per["centre box"] = {s: {"best_accuracy": runs[s]["centre_box"]["best_accuracy"]} for s in seeds}
    pairs = []
    for conv in maps.CONVENTIONS:
        base = maps.score_name(REFERENCE, conv)
        pairs += [(k, base) for k in per if k.endswith(f"[{conv}]") and k != base]
    pairs += [(maps.score_name(m, "ReLU"), maps.score_name(m, "signed")) for m in maps.METHODS]
    return summarize(per, comparisons=pairs, metrics=["best_accuracy"])


def variant_statistics(
    units: Dict[Any, Dict[str, Any]], seeds: List[int], comparisons, extra: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """Tables III-IV's statistics: per variant and seed ``train_p_at_1``, ``test_p_at_1`` and the best localisation
    accuracy of every method and convention; ``comparisons`` (``[(variant, baseline)]``) on every one of them
    (:func:`pml_extensions.runner.outputs.results.summarize`; ``extra`` goes into the dict)."""
    names = list(units[seeds[0]])
    metrics = ["train_p_at_1", "test_p_at_1"] + list(units[seeds[0]][names[0]]["scores"])
    per_seed = {
        name: {
            s: {
                "train_p_at_1": units[s][name]["train_p_at_1"],
                "test_p_at_1": units[s][name]["test_p_at_1"],
                **{k: v["best_accuracy"] for k, v in units[s][name]["scores"].items()},
            }
            for s in seeds
        }
        for name in names
    }
    return summarize(per_seed, comparisons=comparisons, metrics=metrics, extra=extra)


def run(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Any]:
    """Fine-tune and measure every variant at every seed (resuming what is there), compare, write ``results.json``
    and ``results.md``; returns the results dict (see the module docstring).

    Raises:
        ConfigError: bad settings or specs, naming the file and the key.
    """
    start = time.time()
    state = _Run(config, experiment_folder, sources, log)
    units = _units(state)
    seeds, names = state.s["seeds"], list(state.s["variants"])
    runs = {}
    for seed in seeds:
        facts = state.exp.stage_result(f"data/seed_{seed}")
        if facts is None:  # written with the seed's first unit; rebuilt if it went missing
            state.data(seed)
            facts = state.exp.stage_result(f"data/seed_{seed}")
        runs[seed] = {
            "losses": units[seed],
            "centre_box": facts["centre_box"],
            "thresholds": facts["thresholds"],
            "feature_size": units[seed][names[0]]["feature_size"],
            "n_train": facts["n_train"],
            "n_test": facts["n_test"],
            "image_size": facts["image_size"],
        }
    results = variant_statistics(
        units,
        seeds,
        state.s["comparisons"],
        extra={
            "protocol": "localization",
            "seeds": seeds,
            "device": str(state.device),
            "dataset": state.first["dataset"],
            "test_dataset": state.first["test_dataset"],
            "num_epochs": state.first["num_epochs"],
            "iterations_per_epoch": state.first["iterations_per_epoch"],
            "batch_size": state.first.get("batch_size", 32),
            "methods": {name: method_statistics(runs, seeds, name) for name in names},
            "runs": {str(s): r for s, r in runs.items()},
            "seconds_this_invocation": time.time() - start,
            "train_seconds_sum": sum(units[s][n]["train_seconds"] for s in seeds for n in names),
        },
    )
    first_run = runs[seeds[0]]
    header = (
        f"Localisation of unseen-class test composites ({first_run['n_test']} per seed at "
        f"{first_run['image_size'][0]} px -> {first_run['feature_size'][0]}×{first_run['feature_size'][1]} maps), "
        f"{first_run['n_train']} training composites, {state.first['num_epochs']} × "
        f"{state.first['iterations_per_epoch']} fine-tuning iterations; seeds {', '.join(map(str, seeds))} (paired: "
        "every variant of a seed starts from the same weights and sees the same batches). Best localisation accuracy "
        "(%, IoU > 0.5) of every method and sign convention, P@1 (%); differences paired by seed, 95 % Student-t "
        "interval."
    )
    lines = []
    for name in names:
        lines += ["", f"Methods of `{name}` (best localisation accuracy, %):", ""]
        lines.append(render_markdown(results["methods"][name], metrics=["best_accuracy"], decimals=1).rstrip())
    metrics = ["train_p_at_1", "test_p_at_1", "Decomposition [signed]", "Grad-CAM [ReLU]"]
    write_results(experiment_folder, results, metrics=metrics, header=header, footer="\n".join(lines), decimals=1)
    with open(os.path.join(experiment_folder, "results.md"), encoding="utf-8") as f:
        state.log(f.read())
    return results
