"""One (variant, seed) unit of the ``template_block`` protocol: build, train with validation every epoch, keep the best
epoch, test it once.

Training is PML's ``TrainWithClassifier`` (classification) or ``MetricLossOnly`` (metric learning), or the config's
``trainer``; a variant with a block trains with :class:`~pml_extensions.trainers.TemplateMatchingTrainer` (its
``aux_weight`` the variant's λ) and the same keyword arguments. An "epoch" is ``iterations_per_epoch`` iterations of
``batch_size``; after each, the validation images score the model (top-1 accuracy in %, or the tester's metrics for
metric learning) and the best epoch's weights are kept (the untrained model is not a candidate). The test images are
read once, by the selected weights.

Resume (:class:`~pml_extensions.runner.experiment.epoch_loop.EpochLoop`): a checkpoint after every epoch holds the
models, optimizers, losses and RNG states; a killed unit resumes after its last finished epoch and ends with the
numbers an uninterrupted run gives:

- a sampler that takes a ``generator`` (``RandomSampler``: uniform batches with replacement, ``num_samples`` one
  epoch) draws from ``torch.Generator().manual_seed(seed)``; the sampler of epoch e is a new one whose generator has
  first run through the e − 1 epochs before it, so every variant of a seed, resumed or not, sees the same batches;
  other samplers (PML's ``MPerClassSampler``) draw from the global RNGs, reseeded with ``seed + 3`` before training
  and restored from the checkpoint;
- ``lr_schedulers`` (``<model>_scheduler_by_iteration: {OneCycleLR: {}}``; ``max_lr`` is filled from the optimizer,
  ``total_steps`` with ``num_epochs × iterations_per_epoch``) are functions of the iteration: a resumed unit builds
  them afresh and steps them to its iteration;
- with ``feature_cache`` the training view is the cache of the training images drawn with the unit's seed, moved to
  the next epoch's views at the end of every epoch (a resumed unit starts at its epoch's views).
"""

import os
import time
import warnings
from typing import Any, Callable, Dict, Optional

import torch

from pml_extensions.runner.config.registry import resolve
from pml_extensions.runner.config.specs import one_spec
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.experiment.checkpoint import Checkpointer, load_weights
from pml_extensions.runner.experiment.epoch_loop import EpochLoop
from pml_extensions.runner.experiment.folder import seed_everything
from pml_extensions.runner.objects.builder import Builder, accepts
from pml_extensions.runner.objects.feature_cache import end_of_epoch_hook
from pml_extensions.trainers.template_matching_trainer import AUX_LOSS

from . import variant as variants_

RETRIEVAL_METRICS = ("mean_average_precision_at_r", "precision_at_1", "r_precision")
DEFAULT_TRAINERS = {"classification": "TrainWithClassifier", "metric_learning": "MetricLossOnly"}


def primary_metric(task: str) -> str:
    """``"accuracy"`` (classification, %) or ``"mean_average_precision_at_r"`` (metric learning)."""
    return "accuracy" if task == "classification" else RETRIEVAL_METRICS[0]


@torch.no_grad()
def classification_accuracy(models: Dict[str, torch.nn.Module], view, device, batch_size: int = 1000) -> float:
    """Top-1 accuracy (%) of ``classifier(embedder(trunk(x)))`` on ``view``, in eval mode (the models are left in eval
    mode; the trainer puts them back in train mode)."""
    for m in models.values():
        m.eval()
    loader = torch.utils.data.DataLoader(view, batch_size=batch_size, shuffle=False, num_workers=0)
    correct = 0
    for x, y in loader:
        logits = models["classifier"](models["embedder"](models["trunk"](x.to(device))))
        correct += int((logits.argmax(1).cpu() == y).sum())
    return 100.0 * correct / len(view)


def retrieval_metrics(tester, view, split: str, models, epoch: int) -> Dict[str, float]:
    """The tester's metrics of ``view`` (class-disjoint retrieval, every item a query against the rest)."""
    tester.test({split: view}, epoch, models["trunk"], models["embedder"])
    acc = tester.all_accuracies[split]
    return {m: float(acc[f"{m}_level0"]) for m in RETRIEVAL_METRICS if f"{m}_level0" in acc}


def make_sampler(builder: Builder, cfg: Dict[str, Any], view, seed: int, epoch: int):
    """The sampler of ``epoch`` (see the module docstring): ``sampler`` with its own generator advanced past the
    epochs before, or the Builder's sampler over the view's labels (global RNG). ``None`` without ``sampler``."""
    spec = cfg.get("sampler")
    batch, ipe = int(cfg["batch_size"]), int(cfg["iterations_per_epoch"])
    if spec is None:
        return None
    name, kwargs = one_spec(spec, builder.where("sampler"))
    cls = resolve(name, builder.where("sampler"))
    if not accepts(cls, "generator"):
        return builder.build_sampler(view.labels, batch, ipe)
    kwargs = dict(kwargs)
    if "num_samples" not in kwargs and accepts(cls, "num_samples"):
        kwargs["num_samples"] = ipe * batch
    extra = {"generator": torch.Generator().manual_seed(int(seed))}
    if accepts(cls, "data_source"):
        extra["data_source"] = view
    sampler = builder.build("sampler", {name: kwargs}, **extra)
    for _ in range(int(epoch) - 1):  # the generator runs through the epochs before this one
        for _ in sampler:
            pass
    return sampler


def make_schedulers(builder: Builder, cfg: Dict[str, Any], optimizers, total_steps: int, done: int):
    """``lr_schedulers`` with ``total_steps`` filled, stepped ``done`` times (a resumed unit's iteration)."""
    specs = {}
    for key, spec in (cfg.get("lr_schedulers") or {}).items():
        name, kwargs = one_spec(spec, builder.where(f"lr_schedulers.{key}"))
        kwargs = dict(kwargs)
        if "total_steps" not in kwargs and accepts(resolve(name, builder.where("lr_schedulers")), "total_steps"):
            kwargs["total_steps"] = int(total_steps)
        specs[key] = {name: kwargs}
    schedulers = builder.build_lr_schedulers(optimizers, specs)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": a replay, not a mistake
        warnings.simplefilter("ignore")
        for _ in range(int(done)):
            for key, s in schedulers.items():
                if "_scheduler_by_iteration" in key:
                    s.step()
    return schedulers


def trainer_spec(builder: Builder, cfg: Dict[str, Any], task: str) -> Dict[str, Any]:
    """``{Trainer: kwargs}``: the config's ``trainer`` (default by task) with ``batch_size``,
    ``iterations_per_epoch`` and ``dataloader_num_workers`` from the top-level keys; a variant with a block trains
    with ``TemplateMatchingTrainer`` and its ``aux_weight``."""
    name, kwargs = one_spec(cfg.get("trainer"), builder.where("trainer"), default=DEFAULT_TRAINERS[task])
    kwargs = dict(kwargs)
    kwargs.update(
        batch_size=int(cfg["batch_size"]),
        iterations_per_epoch=int(cfg["iterations_per_epoch"]),
        dataloader_num_workers=int(cfg.get("dataloader_num_workers", 0)),
    )
    lam = variants_.aux_weight(cfg)
    if lam is not None:
        name, kwargs["aux_weight"] = "TemplateMatchingTrainer", lam
    return {name: kwargs}


def train_unit(
    name: str,
    cfg: Dict[str, Any],
    seed: int,
    stage_dir: str,
    views: Dict[str, Any],
    task: str,
    device: torch.device,
    log: Callable[..., None] = print,
    sources: Optional[Dict[str, str]] = None,
    soft: Optional[Dict[str, float]] = None,
) -> Dict[str, Any]:
    """Train one variant at one seed, select on validation, test once; returns the unit's summary (``test``,
    ``val``, ``best_epoch``, ``best_iteration``, ``history``, ``params``, ``train_seconds``) and, under ``models``,
    the selected models.

    Raises:
        ConfigError: bad specs (the file and the key).
    """
    b = Builder(cfg, sources, device, log)
    num_classes = views["num_classes"]
    train_view = views["train"]
    if hasattr(train_view, "set_epoch"):  # cached prefix outputs: this seed's draws of the views
        train_view = b.build(
            "feature_cache.train", {"CachedFeatureDataset": {"folder": train_view.folder, "seed": seed}}
        )
    models = variants_.build_models(b, cfg, seed, num_classes, views["train"][0][0], soft)
    params = variants_.count_parameters(models)
    loss_funcs, mining_funcs = b.build_losses(models, num_classes)
    if variants_.aux_weight(cfg) is not None and AUX_LOSS not in loss_funcs:  # the block's patch loss (the trainer's)
        loss_funcs[AUX_LOSS] = b.build(f"loss_funcs.{AUX_LOSS}", {"PatchClassificationLoss": {}}).to(device)
    optimizers = b.build_optimizers(models, loss_funcs)
    ipe, epochs = int(cfg["iterations_per_epoch"]), int(cfg["num_epochs"])
    primary = primary_metric(task)
    eval_batch = int(cfg.get("eval_batch_size") or 1000)
    tester = None
    if task == "metric_learning":
        tester = b.build_tester()

    def validate(epoch):
        if task == "classification":
            return {"val": {primary: classification_accuracy(models, views["val"], device, eval_batch)}}
        return {"val": retrieval_metrics(tester, views["val"], "val", models, epoch)}

    ckpt = Checkpointer(stage_dir, epoch_tables={"accuracies_val"})
    loop = EpochLoop(
        ckpt,
        models,
        optimizers,
        loss_funcs,
        num_epochs=epochs,
        primary=primary,
        evaluate=validate,
        best_path=os.path.join(stage_dir, "best_models.pth"),
        patience=None,
        check_untrained=False,
        log=lambda line: log(f"  {line}"),
        name=f"[{name} seed {seed}]",
        where=b.where("num_epochs"),
    )
    if loop.resume() is None:  # a resumed unit gets its RNG states back from the checkpoint instead
        seed_everything(seed + 3)
    epoch = {"next": loop.start_epoch}
    epoch_hook = lambda trainer: True  # noqa: E731
    if hasattr(train_view, "set_epoch"):  # cached views: epoch e shows the views drawn for e completed epochs
        train_view.set_epoch(loop.start_epoch - 1)
        epoch_hook = end_of_epoch_hook(train_view)

    def new_sampler():
        sampler = make_sampler(b, cfg, train_view, seed, epoch["next"])
        epoch["next"] += 1
        return sampler

    def make_trainer():
        done = (loop.start_epoch - 1) * ipe
        schedulers = make_schedulers(b, cfg, optimizers, epochs * ipe, done)
        return b.build_trainer(
            trainer_spec(b, cfg, task),
            models=models,
            optimizers=optimizers,
            loss_funcs=loss_funcs,
            mining_funcs=mining_funcs,
            dataset=train_view,
            sampler=None,  # the loop gives every epoch its sampler (new_sampler) before it trains
            data_device=device,
            lr_schedulers=schedulers,
            end_of_iteration_hook=loop.end_of_iteration,
            end_of_epoch_hook=epoch_hook,
        )

    start = time.time()
    best = loop.run(make_trainer, new_sampler)
    train_seconds = time.time() - start
    if best["epoch"] < 1:
        raise ConfigError(f"{b.where('num_epochs')}: [{name} seed {seed}] no epoch was validated")
    for k, sd in load_weights(os.path.join(stage_dir, "best_models.pth"), device).items():
        models[k].load_state_dict(sd)
    if task == "classification":
        test = {primary: classification_accuracy(models, views["test"], device, eval_batch)}
    else:
        test = retrieval_metrics(tester, views["test"], "test", models, -1)
    history = [
        {"epoch": int(r["epoch"]), "iteration": int(r["epoch"]) * ipe, **{k: float(r[k]) for k in best["metrics"]}}
        for r in ckpt.rows("accuracies_val")
    ]
    return {
        "test": test,
        "val": {primary: float(best["metric"])},
        "best_epoch": int(best["epoch"]),
        "best_iteration": int(best["epoch"]) * ipe,
        "history": history,
        "params": params,
        "train_seconds": train_seconds,
        "models": models,
    }


def load_unit_models(
    cfg: Dict[str, Any], seed: int, stage_dir: str, views: Dict[str, Any], device, sources=None, soft=None
) -> Dict[str, torch.nn.Module]:
    """A finished unit's selected models, rebuilt from its config and loaded (``weights_only=True``)."""
    b = Builder(cfg, sources, device, lambda *a, **k: None)
    models = variants_.build_models(b, cfg, seed, views["num_classes"], views["train"][0][0], soft)
    for k, sd in load_weights(os.path.join(stage_dir, "best_models.pth"), device).items():
        models[k].load_state_dict(sd)
    return models


def per_seed_row(result: Dict[str, Any]) -> Dict[str, float]:
    """The unit's numbers in ``results.json``'s ``per_seed``: ``test_<metric>``, ``val_<primary>``,
    ``best_iteration``."""
    row = {f"test_{k}": float(v) for k, v in result["test"].items()}
    row.update({f"val_{k}": float(v) for k, v in result["val"].items()})
    row["best_iteration"] = float(result["best_iteration"])
    return row
