"""The ``template_block`` protocol: the template-matching block against its controls, paired over seeds (Gorgun,
Gurbuz & Alatan, BMVC 2022: Table 1, the auxiliary-loss row, Fig. 3's soft maximizers, Fig. 4's λ sweep).

Every entry of ``variants`` is merged over the config (powerful-benchmarker syntax) and trained once per seed of
``seeds`` (default ``[0, 1, 2]``), variant after variant. A variant is what its keys make it (:mod:`.variant`): the
plain network; ``template_block: {...}`` (the block, its position ``after``, its λ ``aux_weight``; ``mixing: none``
is the auxiliary loss alone); ``match_parameters`` (a wider or deeper plain network with at least another variant's
parameters); ``soft_maximizer`` (the paper's BN-ReLU replacement). The data (:mod:`.data`): ``task:
classification`` (the same classes in training, validation and test images) or ``task: metric_learning``
(class-disjoint test classes, validation classes held out of the training classes). Within a seed all variants
start from the same weights for the modules they share and see the same batches; the best epoch is chosen on the
validation images and only the selected weights are tested (:mod:`.unit`). ``comparisons: [[variant, baseline],
...]`` are reported as paired per-seed differences of the test metric with a 95 % t interval
(:mod:`pml_extensions.runner.outputs.results`).

Every object comes from the one :class:`~pml_extensions.runner.objects.builder.Builder` (datasets, views,
transforms, models, the block and the soft maximizers, losses, optimizers, learning-rate schedulers, samplers,
testers, trainers). One process (no torchrun).

``feature_cache`` (the key of :mod:`pml_extensions.runner.objects.feature_cache`): the trunk's frozen pretrained
prefix runs once per image (and per seeded training view); every variant trains its rest — the block, when it has one,
inserted before the split, so ``template_block.after`` names a module of the whole trunk at or after the boundary —
on the cached outputs (:mod:`.data`), the caches in ``<experiment folder>/feature_cache`` unless
``feature_cache.folder`` names a shared one. The prefix must not depend on the seed (pretrained weights).

Outputs under the experiment folder: ``results.json`` (``variants`` / ``comparisons``: per seed ``test_<metric>``,
``val_<metric>`` and ``best_iteration``; plus ``units`` (per variant and seed: validation history, best epoch,
parameters, train time), ``params``, ``sizes``, ``num_classes``, ``soft_maximizer`` (μ, η per variant),
``match_parameters``), ``results.md``, ``report.html`` and ``<variant>/seed_<s>/`` with the record-keeper logs,
``checkpoint.pth`` (every epoch), ``best_models.pth`` and ``result.json``. A rerun skips finished units and resumes an
interrupted one from its last epoch.
"""

import json
import os
import time
from typing import Any, Callable, Dict, Iterable, Optional

from ...errors import ConfigError
from ...experiment.folder import Experiment, saved_config
from ...objects.builder import Builder
from ...objects.feature_cache import check_fixed_prefix
from ...outputs.results import METRIC_NAMES, summarize, write_results
from . import variant as variants_
from .data import build_views
from .settings import CONFIG_KEYS, settings
from .unit import load_unit_models, per_seed_row, primary_metric, train_unit

DATA_KEYS = ("task", "dataset", "test_dataset", "dataset_root", "split", "validation", "transforms", "normalize")
__all__ = ["CONFIG_KEYS", "load_models", "prepare", "run", "run_units"]


class _Run:
    """The state of one call: settings, device, views per data config, matched variant configs, μ/η estimates."""

    def __init__(self, config, folder, sources, log):
        self.s = settings(config, sources)
        self.folder, self.sources = folder, sources or {}
        self.exp = Experiment(folder, {"device": config.get("device", "auto"), "seed": None}, sources, log)
        self.log, self.device = self.exp.log, self.exp.device
        self._views: Dict[str, Any] = {}
        self._configs: Dict[str, Dict[str, Any]] = {}
        self.soft: Dict[str, Dict[str, Any]] = {}

    def views(self, cfg):
        cached = cfg.get("feature_cache") is not None
        keys = DATA_KEYS + (("feature_cache",) if cached else ())
        key = json.dumps(
            [{k: cfg.get(k) for k in keys}, cfg["models"]["trunk"] if cached else None], sort_keys=True, default=str
        )
        if key not in self._views:
            if cached:  # one cache serves every seed only when the frozen prefix does not depend on it
                trunk_only = dict(cfg, models={"trunk": cfg["models"]["trunk"]})
                check_fixed_prefix(
                    lambda: Builder(trunk_only, self.sources, self.device, self.log),
                    self.s["seeds"],
                    f"{self.sources.get('feature_cache', 'config')}: feature_cache",
                )
            builder = Builder(cfg, self.sources, self.device, self.log)
            self._views[key] = build_views(builder, cfg, self.s["task"], experiment_folder=self.folder)
        return self._views[key]

    def config(self, name):
        """The variant's config, with its ``match_parameters`` scaling applied."""
        if name not in self._configs:
            cfg = self.s["variants"][name]
            if cfg.get("match_parameters"):
                views = self.views(cfg)
                target = self.config(cfg["match_parameters"]["variant"])
                cfg = variants_.match_parameters(
                    cfg, target, views["num_classes"], views["train"][0][0], self.sources, self.device
                )
            self._configs[name] = cfg
        return self._configs[name]

    def stage(self, name, seed):
        return f"{name}/seed_{seed}"

    def soft_estimates(self, name):
        """μ and η of a ``soft_maximizer`` variant from its ``estimate_from`` variants' trained models (every seed)."""
        cfg = self.config(name)
        spec = cfg.get("soft_maximizer")
        if spec is None:
            return None
        if name not in self.soft:
            sources_of = [spec["estimate_from"]] if isinstance(spec["estimate_from"], str) else spec["estimate_from"]
            views, trunks = self.views(cfg), []
            for other in sources_of:
                for seed in self.s["seeds"]:
                    stage = self.stage(other, seed)
                    if self.exp.stage_result(stage) is None:
                        raise ConfigError(
                            f"{self.sources.get('variants', 'config')} (variants.{name}): "
                            f"soft_maximizer.estimate_from: {other} seed {seed} is not trained yet (train the BN-ReLU "
                            "variants first)"
                        )
                    models = load_unit_models(
                        self.config(other), seed, self.exp.stage_folder(stage), views, self.device, self.sources
                    )
                    trunks.append(models["trunk"])
            batches = variants_.probe_batches(
                views["train_eval"], spec.get("probe_images", 1000), spec.get("probe_batch_size", 250)
            )
            self.soft[name] = variants_.soft_estimates(trunks, batches, self.device)
            self.log(f"{name}: μ = {self.soft[name]['mu']:.4f}, η = {self.soft[name]['eta']:.4f} from {sources_of}")
        return self.soft[name]

    def unit(self, name, seed):
        stage = self.stage(name, seed)
        done = self.exp.stage_result(stage)
        if done is not None:
            return done
        cfg = self.config(name)
        result = train_unit(
            name,
            cfg,
            seed,
            self.exp.stage_folder(stage),
            self.views(cfg),
            self.s["task"],
            self.device,
            self.log,
            self.sources,
            self.soft_estimates(name),
        )
        result = {k: v for k, v in result.items() if k != "models"}
        metric = primary_metric(self.s["task"])
        self.log(
            f"{name} seed {seed}: test {metric} {result['test'][metric]:.4f}, validation {result['val'][metric]:.4f} "
            f"at iteration {result['best_iteration']} ({result['train_seconds']:.0f} s)"
        )
        return self.exp.finish_stage(stage, result)


def prepare(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Dict[str, int]]:
    """Build every variant's data views without training — with ``feature_cache`` its caches (one process builds
    what the later parts, e.g. per-seed processes, then find). Returns ``{variant: sizes}``.

    Raises:
        ConfigError: bad settings, a cache that cannot be built.
    """
    state = _Run(config, experiment_folder, sources, log)
    return {name: state.views(state.config(name))["sizes"] for name in state.s["variants"]}


def run_units(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
    variants: Optional[Iterable[str]] = None,
    seeds: Optional[Iterable[int]] = None,
) -> Dict[str, Dict[str, Any]]:
    """Train (or find finished) the units of ``variants`` × ``seeds`` (default all), variant after variant, without
    writing ``results.json``: a part of the experiment that processes can share out (each its seeds) before
    :func:`run` gathers them. Returns ``{variant: {seed: unit summary}}``.

    Raises:
        ConfigError: bad settings, or a variant or seed the config does not have.
    """
    state = _Run(config, experiment_folder, sources, log)
    return _units(state, variants, seeds)


def _units(state: _Run, variants=None, seeds=None):
    names = list(state.s["variants"]) if variants is None else list(variants)
    chosen = list(state.s["seeds"]) if seeds is None else [int(s) for s in seeds]
    unknown = [n for n in names if n not in state.s["variants"]] + [s for s in chosen if s not in state.s["seeds"]]
    if unknown:
        raise ConfigError(f"template_block: {unknown} are not variants / seeds of this config")
    out: Dict[str, Dict[str, Any]] = {}
    for name in names:
        for seed in chosen:
            out.setdefault(name, {})[seed] = state.unit(name, seed)
    return out


def run(
    config: Dict[str, Any],
    experiment_folder: str,
    sources: Optional[Dict[str, str]] = None,
    log: Callable[..., None] = print,
) -> Dict[str, Any]:
    """Train every variant at every seed (resuming what is there), compare, write ``results.json`` /
    ``results.md``; returns the results dict (see the module docstring).

    Raises:
        ConfigError: bad settings or specs, naming the file and the key.
    """
    start = time.time()
    state = _Run(config, experiment_folder, sources, log)
    units = _units(state)
    task, seeds = state.s["task"], state.s["seeds"]
    metric = primary_metric(task)
    first_name = next(iter(state.s["variants"]))
    first = state.config(first_name)
    views = state.views(first)
    soft = {n: state.soft_estimates(n) for n in state.s["variants"] if state.config(n).get("soft_maximizer")}
    results = summarize(
        {name: {seed: per_seed_row(r) for seed, r in per.items()} for name, per in units.items()},
        comparisons=state.s["comparisons"],
        metrics=[f"test_{metric}"],
        extra={
            "protocol": "template_block",
            "task": task,
            "primary_metric": metric,
            "seeds": seeds,
            "dataset": first["dataset"],
            "test_dataset": first.get("test_dataset"),
            "device": str(state.device),
            "num_classes": views["num_classes"],
            "sizes": views["sizes"],
            "num_epochs": first["num_epochs"],
            "iterations_per_epoch": first["iterations_per_epoch"],
            "batch_size": first["batch_size"],
            "params": {name: per[seeds[0]]["params"] for name, per in units.items()},
            "aux_weight": {n: variants_.aux_weight(state.config(n)) for n in units},
            "match_parameters": {
                n: state.config(n)["match_parameters"] for n in units if state.config(n).get("match_parameters")
            },
            "soft_maximizer": soft,
            "units": {
                name: {str(seed): {k: v for k, v in r.items() if k != "test"} for seed, r in per.items()}
                for name, per in units.items()
            },
            "seconds_this_invocation": time.time() - start,
            "train_seconds_sum": sum(r["train_seconds"] for per in units.values() for r in per.values()),
        },
    )
    shown = METRIC_NAMES.get(metric, metric + (" (%)" if metric == "accuracy" else ""))
    header = (
        f"Task {task}: {views['num_classes']} training classes, {views['sizes']['train']} training / "
        f"{views['sizes']['val']} validation / {views['sizes']['test']} test images; {first['num_epochs']} epochs × "
        f"{first['iterations_per_epoch']} iterations, batch {first['batch_size']}; best epoch chosen on the validation "
        f"images, test {shown} of that checkpoint; seeds {', '.join(map(str, seeds))} (paired: same initial weights "
        "for shared modules and same batches within a seed); differences paired by seed, 95 % Student-t interval."
    )
    params = ", ".join(f"{n} {p:,}" for n, p in results["params"].items())
    write_results(
        experiment_folder,
        results,
        metrics=[f"test_{metric}", f"val_{metric}", "best_iteration"],
        header=header,
        footer=f"Parameters (every model): {params}.",
        decimals=4 if task == "metric_learning" else 2,
    )
    with open(os.path.join(experiment_folder, "results.md"), encoding="utf-8") as f:
        state.log(f.read())
    return results


def load_models(experiment_folder: str, variant: str, seed: Optional[int] = None, device=None):
    """A finished unit's selected models and the experiment's data views, rebuilt from the folder's ``config.yaml``
    (e.g. to look at the block's class scores).

    Returns:
        ``(models, views)``: ``{"trunk", "embedder", ["classifier"]}`` in eval mode, and :func:`.data.build_views`.

    Raises:
        ConfigError: no ``config.yaml`` in the folder, an unknown variant or seed, or a unit that has not finished.
    """
    config = saved_config(experiment_folder)
    if config is None:
        raise ConfigError(f"{experiment_folder}: no config.yaml (not an experiment folder)")
    if device is not None:
        config = dict(config, device=str(device))
    state = _Run(config, experiment_folder, None, lambda *a, **k: None)
    if variant not in state.s["variants"]:
        raise ConfigError(f"{experiment_folder}: variant {variant!r} not in {sorted(state.s['variants'])}")
    seed = state.s["seeds"][0] if seed is None else int(seed)
    stage = state.stage(variant, seed)
    if seed not in state.s["seeds"] or state.exp.stage_result(stage) is None:
        raise ConfigError(f"{experiment_folder}: {stage} has not finished")
    cfg = state.config(variant)
    views = state.views(cfg)
    models = load_unit_models(
        cfg, seed, state.exp.stage_folder(stage), views, state.device, soft=state.soft_estimates(variant)
    )
    for m in models.values():
        m.eval()
    return models, views
