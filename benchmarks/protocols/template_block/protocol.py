"""The ``template_block`` protocol (a plugin of the runner, ``protocol: benchmarks.protocols.template_block``): the
template-matching block against its controls, paired over seeds (Gorgun,
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

import dataclasses
import json
from typing import Any, Dict, Optional

from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.experiment.folder import saved_config
from pml_extensions.runner.objects.builder import Builder
from pml_extensions.runner.objects.feature_cache import check_fixed_prefix
from pml_extensions.runner.protocols.base import REQUIRED, setting
from pml_extensions.runner.protocols.paired_protocol import PairedProtocol
from pml_extensions.utils.verdicts import METRIC_NAMES

from . import variant as variants_
from .data import build_views
from .settings import check_task, check_variant
from .unit import RETRIEVAL_METRICS, load_unit_models, per_seed_row, primary_metric, train_unit

DATA_KEYS = ("task", "dataset", "test_dataset", "dataset_root", "split", "validation", "transforms", "normalize")


@dataclasses.dataclass
class Settings:
    """The keys of one variant of the ``template_block`` protocol."""

    dataset: Any = setting(REQUIRED, "The training data, one `{ClassName: kwargs}`.")
    models: Dict[str, Any] = setting(REQUIRED, "`{trunk, embedder, classifier}` specs.", "mapping")
    loss_funcs: Dict[str, Any] = setting(REQUIRED, "`{name: {LossClass: kwargs}}`.", "mapping")
    optimizers: Dict[str, Any] = setting(REQUIRED, "`{<model>_optimizer: {OptimizerClass: kwargs}}`.", "mapping")
    num_epochs: int = setting(REQUIRED, "Epochs per variant and seed.", "int", minimum=1)
    iterations_per_epoch: int = setting(REQUIRED, "Training iterations per epoch.", "int", minimum=1)
    batch_size: int = setting(REQUIRED, "Training batch size.", "int", minimum=1)
    task: str = setting(
        "classification",
        "`classification` or `metric_learning`.",
        "choice",
        choices=("classification", "metric_learning"),
    )
    test_dataset: Any = setting(None, "The dataset of the test images (default: `dataset`'s `test` split).")
    dataset_root: Optional[str] = setting(None, "Folder given to datasets that take `root`.", "str")
    split: Any = setting(None, "`{train, val, test, seed}` per class (classification).")
    validation: Any = setting(None, "`{class_fraction, seed}` (metric learning).")
    transforms: Any = setting(None, "`{train: ..., eval: ...}` torchvision transforms.")
    normalize: Any = setting(None, "The `Normalize` appended to the transforms.")
    template_block: Any = setting(None, "`{after, aux_weight, mixing, ...}`: the block and its patch loss weight.")
    soft_maximizer: Any = setting(None, "`{mixing: softmax | perturbed, estimate_from: [...]}`.")
    match_parameters: Any = setting(None, "`{variant, widen | deepen}`: a plain network with a variant's parameters.")
    feature_cache: Any = setting(None, "Train the trunk's rest on cached outputs of its frozen prefix.")
    mining_funcs: Any = setting({}, "`{name: {MinerClass: kwargs}}`.", optional=True)
    sampler: Any = setting(None, "The batch sampler.")
    lr_schedulers: Any = setting(None, "`{name: {ClassName: kwargs}}`, stepped every iteration.")
    trainer: Any = setting(None, "The PML trainer (default by task).")
    tester: Any = setting(None, "The PML tester (metric learning).")
    accuracy_calculator: Any = setting(None, "The tester's accuracy calculator.")
    eval_batch_size: Optional[int] = setting(None, "Batch size of the evaluation passes.", "int", minimum=1)
    dataloader_num_workers: int = setting(0, "DataLoader worker processes.", "int", minimum=0)


class TemplateBlock(PairedProtocol):
    """The template-matching block against its controls, paired over seeds (see the module docstring)."""

    name = "template_block"
    description = "template-matching block vs its controls (plain, aux loss only, wider), paired over seeds"
    Settings = Settings

    def __init__(self, config, folder, sources=None, log=print):
        super().__init__(config, folder, sources, log)
        self.task = next(iter(self.variant_settings.values())).task
        metric = primary_metric(self.task)
        # every test metric the unit measures goes into results.json (metric learning: MAP@R, P@1, R-precision)
        tested = (metric,) if self.task == "classification" else RETRIEVAL_METRICS
        self.metrics = tuple(f"test_{m}" for m in tested) + (f"val_{metric}", "best_iteration")
        self.decimals = 4 if self.task == "metric_learning" else 2
        self._views: Dict[str, Any] = {}
        self._configs: Dict[str, Dict[str, Any]] = {}
        self.soft: Dict[str, Dict[str, Any]] = {}

    @property
    def selection_metric(self) -> str:
        return primary_metric(self.task)

    @classmethod
    def check(cls, config, sources=None):
        super().check(config, sources)
        configs, _, _ = cls.variants(config, sources)
        names = list(configs)
        for name, cfg in configs.items():
            check_variant(cfg, name, names, sources)
        check_task(configs, sources)

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
                    self.settings.seeds,
                    f"{self.sources.get('feature_cache', 'config')}: feature_cache",
                )
            builder = Builder(cfg, self.sources, self.device, self.log)
            self._views[key] = build_views(builder, cfg, self.task, experiment_folder=self.folder)
        return self._views[key]

    def config_of(self, name):
        """The variant's config, with its ``match_parameters`` scaling applied."""
        if name not in self._configs:
            cfg = self.variant_configs[name]
            if cfg.get("match_parameters"):
                views = self.views(cfg)
                target = self.config_of(cfg["match_parameters"]["variant"])
                cfg = variants_.match_parameters(
                    cfg, target, views["num_classes"], views["train"][0][0], self.sources, self.device
                )
            self._configs[name] = cfg
        return self._configs[name]

    def soft_estimates(self, name):
        """μ and η of a ``soft_maximizer`` variant from its ``estimate_from`` variants' trained models (every seed;
        trained first when they are not)."""
        cfg = self.config_of(name)
        spec = cfg.get("soft_maximizer")
        if spec is None:
            return None
        if name not in self.soft:
            sources_of = [spec["estimate_from"]] if isinstance(spec["estimate_from"], str) else spec["estimate_from"]
            views, trunks = self.views(cfg), []
            for other in sources_of:
                for seed in self.settings.seeds:
                    self.unit_result(other, seed)
                    models = load_unit_models(
                        self.config_of(other), seed, self.unit_folder(other, seed), views, self.device, self.sources
                    )
                    trunks.append(models["trunk"])
            batches = variants_.probe_batches(
                views["train_eval"], spec.get("probe_images", 1000), spec.get("probe_batch_size", 250)
            )
            self.soft[name] = variants_.soft_estimates(trunks, batches, self.device)
            self.log(f"{name}: μ = {self.soft[name]['mu']:.4f}, η = {self.soft[name]['eta']:.4f} from {sources_of}")
        return self.soft[name]

    def prepare(self) -> Dict[str, Dict[str, int]]:
        """Build every variant's data views without training — with ``feature_cache`` its caches (one process builds
        what the later parts, e.g. per-seed processes, then find). Returns ``{variant: sizes}``."""
        return {name: self.views(self.config_of(name))["sizes"] for name in self.variant_configs}

    def unit(self, settings, variant, seed, folder, builder):
        cfg = self.config_of(variant)
        soft = self.soft_estimates(variant)
        result = train_unit(
            variant, cfg, seed, folder, self.views(cfg), self.task, self.device, self.log, self.sources, soft
        )
        row = per_seed_row(result)
        metric = primary_metric(self.task)
        self.log(
            f"{variant} seed {seed}: test {metric} {result['test'][metric]:.4f}, validation "
            f"{result['val'][metric]:.4f} at iteration {result['best_iteration']} ({result['train_seconds']:.0f} s)"
        )
        return {**{k: v for k, v in result.items() if k not in ("models", "test")}, "test": row}

    def curves(self, units):  # the report draws the validation curves from the logs
        return None

    def header(self, results):
        first = self.config_of(next(iter(self.variant_configs)))
        views = self.views(first)
        metric = primary_metric(self.task)
        shown = METRIC_NAMES.get(metric, metric + (" (%)" if metric == "accuracy" else ""))
        return (
            f"Task {self.task}: {views['num_classes']} training classes, {views['sizes']['train']} training / "
            f"{views['sizes']['val']} validation / {views['sizes']['test']} test images; "
            f"{first['num_epochs']} epochs × {first['iterations_per_epoch']} iterations, batch {first['batch_size']}; "
            f"best epoch chosen on the validation images, test {shown} of that checkpoint; seeds "
            f"{', '.join(map(str, results['seeds']))} "
            "(paired: same initial weights for shared modules and same batches within a seed); differences paired by "
            "seed, 95 % Student-t interval."
        )

    def footer(self, results):
        params = ", ".join(f"{n} {p:,}" for n, p in results["params"].items())
        return f"Parameters (every model): {params}."

    def extra_results(self, units):
        seeds = self.settings.seeds
        first = self.config_of(next(iter(self.variant_configs)))
        views = self.views(first)
        return {
            "task": self.task,
            "primary_metric": primary_metric(self.task),
            "dataset": first["dataset"],
            "test_dataset": first.get("test_dataset"),
            "num_classes": views["num_classes"],
            "sizes": views["sizes"],
            "num_epochs": first["num_epochs"],
            "iterations_per_epoch": first["iterations_per_epoch"],
            "batch_size": first["batch_size"],
            "params": {name: per[seeds[0]]["params"] for name, per in units.items()},
            "aux_weight": {n: variants_.aux_weight(self.config_of(n)) for n in units},
            "match_parameters": {
                n: self.config_of(n)["match_parameters"] for n in units if self.config_of(n).get("match_parameters")
            },
            "soft_maximizer": {n: self.soft_estimates(n) for n in units if self.config_of(n).get("soft_maximizer")},
        }


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
    state = TemplateBlock(config, experiment_folder, None, lambda *a, **k: None)
    if variant not in state.variant_configs:
        raise ConfigError(f"{experiment_folder}: variant {variant!r} not in {sorted(state.variant_configs)}")
    seed = state.settings.seeds[0] if seed is None else int(seed)
    if seed not in state.settings.seeds or state.exp.stage_result(state.stage(variant, seed)) is None:
        raise ConfigError(f"{experiment_folder}: {state.stage(variant, seed)} has not finished")
    cfg = state.config_of(variant)
    views = state.views(cfg)
    models = load_unit_models(
        cfg, seed, state.unit_folder(variant, seed), views, state.device, soft=state.soft_estimates(variant)
    )
    for m in models.values():
        m.eval()
    return models, views


PROTOCOL = TemplateBlock
