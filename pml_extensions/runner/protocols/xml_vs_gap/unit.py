"""One (variant, seed) unit of the ``xml_vs_gap`` protocol: build, train, select on validation, test once.

Pairing (every variant of a seed sees the same start and the same data):

- the global RNGs are re-seeded before each module is built (trunk: ``seed``, embedder: ``seed + 1``, losses:
  ``seed + 2``), so a module shared by two variants gets bit-identical weights even when another module of one
  variant (e.g. ``HistogramPooling``) is extra; the prototypes draw from their own generator
  (``HistogramPooling.reset_parameters(generator)`` / ``init_from_data(seed=...)``), never from the global RNG;
- the RNGs are re-seeded with ``seed + 3`` right before training, so ``MPerClassSampler`` (PML's
  ``c_f.NUMPY_RANDOM``) and the training augmentations draw the same batches for every variant.

Selection: the training classes are split class-disjointly into a training part and a validation part
(:func:`validation_split`); the best epoch is the one with the highest validation MAP@R, epoch 0 (the untrained
model) included and flagged. :func:`train_and_select` never loads the test split; :func:`evaluate` runs once on the
selected model.
"""

import copy
import os
import time
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch

from ....losses import XMLWrapper
from ....trunks import find_histogram_layers
from ...errors import ConfigError, build
from ...experiment.folder import seed_everything

METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")


class LabelSubset(torch.utils.data.Dataset):
    """The items of ``dataset`` at ``indices``, with the ``labels`` array PML's samplers read ([N] int64)."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        self.labels = np.asarray(dataset.labels, dtype=np.int64)[self.indices]
        self.classes = getattr(dataset, "classes", None)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        return self.dataset[int(self.indices[index])]


def validation_split(labels, fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray, list]:
    """Class-disjoint split of the training classes into (train indices, validation indices, validation classes).

    Args:
        labels: ``[N]`` integer labels of the training split.
        fraction: share of the classes held out for validation, in (0, 1); at least 2 classes on each side.
        seed: the classes are drawn with ``numpy.random.default_rng(seed)`` (the same for every variant and seed).

    Raises:
        ConfigError: when ``fraction`` is outside (0, 1) or leaves fewer than 2 classes on a side.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(f"validation.class_fraction must be a number in (0, 1), got {fraction!r}")
    num_val = int(round(fraction * len(classes)))
    if num_val < 2 or len(classes) - num_val < 2:
        raise ConfigError(
            f"validation.class_fraction {fraction} of {len(classes)} training classes leaves {num_val} validation and "
            f"{len(classes) - num_val} training classes; each side needs at least 2"
        )
    val_classes = np.sort(np.random.default_rng(seed).permutation(classes)[:num_val])
    is_val = np.isin(labels, val_classes)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val), val_classes.tolist()


def load_split(cfg: Dict[str, Any], split: str, train_transform: bool, where: str = "config_dataset"):
    """The dataset split ``"train"`` / ``"test"`` of the config, with the train or eval transform."""
    from ....datasets import get_dataset

    ds_cfg = cfg["dataset"]
    tf = build(cfg["transforms"]["train" if train_transform else "eval"], "config_transforms: transforms")
    try:
        return get_dataset(ds_cfg["name"], split, tf, ds_cfg.get("root"), **dict(ds_cfg.get("kwargs") or {}))
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise ConfigError(f"{where}: dataset: {e}") from e


def make_loader(dataset, batch_size, seed):
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed), num_workers=0
    )


def build_models(cfg: Dict[str, Any], seed: int, device: torch.device, init_set=None) -> Dict[str, Any]:
    """Trunk, embedder and losses of one variant, paired by seed (see the module docstring).

    ``init_set`` (the training part with the eval transform) feeds ``prototype_init`` when the config has one.
    """
    seed_everything(seed)
    trunk = build(cfg["models"]["trunk"], "config_models: models.trunk").to(device)
    seed_everything(seed + 1)
    embedder = build(cfg["models"]["embedder"], "config_models: models.embedder").to(device)
    seed_everything(seed + 2)
    loss_funcs = {
        k: build(v, f"config_loss_and_miners: loss_funcs.{k}").to(device) for k, v in cfg["loss_funcs"].items()
    }
    try:
        XMLWrapper.attach_all(loss_funcs, trunk)
        XMLWrapper.attach_heads(loss_funcs, trunk, embedder)  # target="pooled": GAP predictions -> embeddings
    except ValueError as e:
        raise ConfigError(f"config_loss_and_miners: {e}") from e
    mining_funcs = {
        k: build(v, f"config_loss_and_miners: mining_funcs.{k}") for k, v in (cfg.get("mining_funcs") or {}).items()
    }
    pools = find_histogram_layers(trunk)
    for pool in pools:  # own generator: the global RNG stays where the variant without prototypes has it
        pool.reset_parameters(torch.Generator().manual_seed(seed))
        pool.to(device)
    init = cfg.get("prototype_init")
    if pools and init:  # variants without HistogramPooling (GAP) share the key and skip it
        if init_set is None:
            raise ConfigError("prototype_init needs the training images (init_set)")
        from ...build.builder import Builder  # the one prototype_init of every protocol

        spec = {"batch_size": int(cfg["batch_size"]), **(init if isinstance(init, dict) else {})}
        Builder({"prototype_init": spec}, {"prototype_init": "config_general"}).prototype_init(
            {"trunk": trunk}, init_set, seed=seed
        )
    return {"trunk": trunk, "embedder": embedder, "loss_funcs": loss_funcs, "mining_funcs": mining_funcs}


def build_optimizers(cfg, models):
    """``trunk_optimizer``, ``embedder_optimizer`` and ``<loss>_optimizer`` entries. A ``prototype_lr`` key in the
    trunk optimizer's spec is not a torch argument: the prototypes then get their own parameter group at that lr."""
    optimizers = {}
    for key, spec in cfg["optimizers"].items():
        model = {"trunk_optimizer": models["trunk"], "embedder_optimizer": models["embedder"]}.get(key)
        if model is None:
            model = models["loss_funcs"].get(key.replace("_optimizer", ""))
        if model is None:
            raise ConfigError(
                f"config_optimizers: optimizers.{key} names no model or loss "
                "(use trunk_optimizer, embedder_optimizer or <loss>_optimizer)"
            )
        spec = copy.deepcopy(spec)
        ((cls, kwargs),) = spec.items()
        kwargs = dict(kwargs or {})
        proto_lr = kwargs.pop("prototype_lr", None)
        protos = [p.prototype_conv.weight for p in find_histogram_layers(model)] if proto_lr is not None else []
        if protos:
            ids = {id(p) for p in protos}
            params = [
                {"params": [p for p in model.parameters() if id(p) not in ids]},
                {"params": protos, "lr": float(proto_lr)},
            ]
        else:
            params = model.parameters()
        optimizers[key] = build({cls: kwargs}, f"config_optimizers: optimizers.{key}", params=params)
    return optimizers


def make_tester(cfg, device, end_of_testing_hook=None):
    """The variant's tester through the runner's one tester builder (:func:`pml_extensions.runner.pb_eval.build_tester`:
    PML's GlobalEmbeddingSpaceTester / AccuracyCalculator become their sharded, blocked-engine subclasses)."""
    from ...config.eval_keys import build_tester

    ((name, kwargs),) = cfg["tester"].items()
    spec = {"tester": {name: dict(kwargs or {}, accuracy_calculator=cfg["accuracy_calculator"])}}
    extra = {"end_of_testing_hook": end_of_testing_hook} if end_of_testing_hook else {}
    return build_tester(spec, device, {"tester": "config_eval"}, **extra)


def train_and_select(
    name: str, cfg: Dict[str, Any], seed: int, stage_dir: str, device: torch.device, log: Callable = print
) -> Dict[str, Any]:
    """Train one variant at one seed on the training part of the training classes; select the best epoch on the
    validation classes. Never loads the test split.

    Returns:
        ``{"history": [{epoch, metric...}] (validation), "best_epoch", "best_is_untrained", "train_seconds",
        "models": {"trunk", "embedder"} (at the best epoch), "xml": {...}}``.
    """
    from ....trainers import MetricLossOnly
    from ...experiment import distributed as dist_utils
    from ...experiment.checkpoint import Checkpointer, load_weights
    from ...experiment.epoch_loop import EpochLoop

    val_cfg = cfg.get("validation") or {}
    full_train = load_split(cfg, "train", train_transform=True)
    full_eval = load_split(cfg, "train", train_transform=False)
    train_idx, val_idx, _ = validation_split(
        full_train.labels, val_cfg.get("class_fraction", 0.25), int(val_cfg.get("seed", 0))
    )
    train_set, init_set, val_set = (
        LabelSubset(full_train, train_idx),
        LabelSubset(full_eval, train_idx),
        LabelSubset(full_eval, val_idx),
    )
    models = build_models(cfg, seed, device, init_set)
    trunk, embedder, loss_funcs = models["trunk"], models["embedder"], models["loss_funcs"]
    optimizers = build_optimizers(cfg, models)
    batch_size, iterations = int(cfg["batch_size"]), int(cfg["iterations_per_epoch"])

    def new_sampler():
        try:
            return build(
                cfg["sampler"],
                "config_loss_and_miners: sampler",
                labels=train_set.labels,
                batch_size=batch_size,
                length_before_new_iter=batch_size * iterations,
            )
        except AssertionError as e:  # PML's samplers check their arguments with assert
            raise ConfigError(
                f"config_loss_and_miners: sampler: {e} (the training part has "
                f"{len(np.unique(train_set.labels))} classes; batch_size is {batch_size})"
            ) from e

    sampler = new_sampler()
    tester = make_tester(cfg, device)

    def validate(epoch):
        tester.test({"val": val_set}, epoch, trunk, embedder)
        acc = tester.all_accuracies["val"]
        return {"val": {m: float(acc[f"{m}_level0"]) for m in METRICS}}

    # checkpoint.pth + logs/ (CSV + SQLite) per epoch: a killed unit resumes after its last finished epoch
    ckpt = Checkpointer(stage_dir, epoch_tables={"accuracies_val"})
    loop = EpochLoop(
        ckpt,
        {"trunk": trunk, "embedder": embedder},
        optimizers,
        loss_funcs,
        num_epochs=int(cfg["num_epochs"]),
        primary=METRICS[0],
        evaluate=validate,
        best_path=os.path.join(stage_dir, "best_models.pth"),
        patience=None,
        log=lambda line: log(f"  {line}"),
        name=f"[{name} seed {seed}]",
        where="config_eval: accuracy_calculator",
    )
    if loop.resume() is None:  # (a resumed unit gets its RNG states back from the checkpoint instead)
        seed_everything(seed + 3)  # the same batches and augmentations for every variant of this seed

    world = dist_utils.world_size()  # under torchrun each process trains on its slice of every global batch
    if batch_size % world:
        raise ConfigError(f"config_general: batch_size {batch_size} is not divisible by {world} processes")

    def make_trainer():
        return MetricLossOnly(
            models=dist_utils.wrap_models({"trunk": trunk, "embedder": embedder}, device),
            optimizers=optimizers,
            batch_size=batch_size // world,
            loss_funcs=dist_utils.wrap_losses(loss_funcs),
            mining_funcs=models["mining_funcs"],
            dataset=train_set,
            sampler=sampler,
            iterations_per_epoch=iterations,
            dataloader_num_workers=int(cfg.get("dataloader_num_workers", 0)),
            data_device=device,
            end_of_iteration_hook=loop.end_of_iteration,
            end_of_epoch_hook=lambda trainer: True,
        )

    def rank_sampler():  # the same global batches on every rank, each rank its slice
        s = new_sampler()
        return dist_utils.DistributedBatchSliceSampler(s, batch_size) if dist_utils.is_active() else s

    start = time.time()
    best = loop.run(make_trainer, rank_sampler)
    train_seconds = time.time() - start
    state = load_weights(os.path.join(stage_dir, "best_models.pth"), device)
    for k in ("trunk", "embedder"):
        models[k].load_state_dict(state[k])
    history = [{"epoch": int(r["epoch"]), **{m: float(r[m]) for m in METRICS}} for r in ckpt.rows("accuracies_val")]
    xml = {}
    for loss in loss_funcs.values():
        if hasattr(loss, "num_skipped_xml"):
            xml = {"num_skipped_xml": int(loss.num_skipped_xml), "last_xml_loss": float(loss.xml_loss)}
    return {
        "history": history,
        "best_epoch": best["epoch"],
        "best_is_untrained": best["epoch"] == 0,
        "train_seconds": train_seconds,
        "models": {"trunk": trunk, "embedder": embedder},
        "xml": xml,
        "num_train_classes": int(len(np.unique(train_set.labels))),
        "num_val_classes": int(len(np.unique(val_set.labels))),
    }


def evaluate(
    cfg: Dict[str, Any], models: Dict[str, torch.nn.Module], device: torch.device, split: str = "test"
) -> Dict[str, float]:
    """Metrics of the (selected) trunk + embedder on one split of the dataset (class-disjoint from training)."""
    dataset = load_split(cfg, split, train_transform=False)
    tester = make_tester(cfg, device)
    tester.test({split: dataset}, -1, models["trunk"], models["embedder"])
    acc = tester.all_accuracies[split]
    return {m: float(acc[f"{m}_level0"]) for m in METRICS}


def load_models(cfg, stage_dir, device):
    """Rebuild a finished unit's trunk + embedder and load its selected weights (``weights_only=True``)."""
    models = build_models({**cfg, "prototype_init": None}, 0, device)
    state = torch.load(os.path.join(stage_dir, "best_models.pth"), map_location=device, weights_only=True)
    for k in ("trunk", "embedder"):
        models[k].load_state_dict(state[k])
    return models
