"""One (variant, seed) unit of the ``localization`` protocol: the model of one loss fine-tuned on the seed's training
composites, through the one :class:`~pml_extensions.runner.objects.builder.Builder`.

Model: the config's ``models`` (trunk, e.g. ImageNet MobileNetV2 features -> GMP -> Flatten, and an ``embedder``).
``frozen_prefix`` names the module path where the frozen part of the trunk ends (``"0.13"``: MobileNetV2's first 14
blocks, as in the paper's fine-tuning of the last blocks): the trunk is split there
(:func:`pml_extensions.trunks.split_trunk`) and trained as ``Sequential(FrozenPrefix(prefix), rest)``, so the
prefix keeps its ImageNet weights and BatchNorm statistics and computes without gradients, while the rest and the
embedder train (the same modules: the evaluation uses the trunk as built).

Pairing: the trunk is drawn after seeding the global RNGs with ``seed`` and the embedder after seeding them with
``seed`` again, so every loss of a seed starts from the same weights; training reseeds with ``seed`` before the first
epoch, so PML's ``MPerClassSampler`` (which draws from ``c_f.NUMPY_RANDOM``) gives every loss the same batches.

Training is the config's ``trainer`` (default PML's ``MetricLossOnly``) for ``num_epochs × iterations_per_epoch``
iterations of ``batch_size``, resumable after every epoch
(:class:`~pml_extensions.runner.experiment.epoch_loop.EpochLoop`); there is no selection: the model after the last
iteration is evaluated (the paper fine-tunes with its recipe, then explains), so the loop's "validation" is the epoch
number.
"""

import os
import time
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from pml_extensions.runner.config.specs import one_spec
from pml_extensions.runner.errors import ConfigError
from pml_extensions.runner.experiment.checkpoint import Checkpointer
from pml_extensions.runner.experiment.epoch_loop import EpochLoop
from pml_extensions.runner.experiment.folder import seed_everything
from pml_extensions.runner.objects.builder import Builder


def build_models(builder: Builder, seed: int, sample: torch.Tensor) -> Dict[str, torch.nn.Module]:
    """``{"trunk", "embedder"}`` (the models as built), the trunk drawn after seeding with ``seed`` and the embedder
    after seeding with ``seed`` again."""

    def reseed(key):
        if key in ("trunk", "embedder"):
            seed_everything(seed)

    return builder.build_models(sample, before=reseed)


def training_trunk(builder: Builder, trunk: torch.nn.Module, boundary: Any) -> torch.nn.Module:
    """``Sequential(FrozenPrefix(prefix), rest)`` of ``trunk`` split at ``boundary`` (``None``: the trunk itself,
    everything trained).

    Raises:
        ConfigError: a boundary where the trunk does not split (the reason in one line).
    """
    if boundary is None:
        return trunk
    from pml_extensions.trunks import split_trunk

    try:
        prefix, rest = split_trunk(trunk, boundary if isinstance(boundary, int) else str(boundary))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{builder.where('frozen_prefix')}: {str(e).splitlines()[0]}") from None
    frozen = builder.build("frozen_prefix", {"FrozenPrefix": None}, prefix=prefix)
    return builder.build("models.trunk", {"Sequential": [frozen, rest]})


def train_unit(
    name: str,
    cfg: Dict[str, Any],
    seed: int,
    stage_dir: str,
    train_view,
    device: torch.device,
    log: Callable[..., None] = print,
    sources: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """Fine-tune one variant at one seed; returns ``{"models": {"trunk", "embedder"}, "loss_start", "loss_end",
    "train_seconds"}`` (the loss means of the first and last 10 iterations, from the logs).

    Raises:
        ConfigError: bad specs (naming the file and the key).
    """
    b = Builder(cfg, sources, device, log)
    models = build_models(b, seed, train_view[0][0])
    trunk = training_trunk(b, models["trunk"], cfg.get("frozen_prefix"))
    train_models = {"trunk": trunk, "embedder": models["embedder"]}
    loss_funcs, mining_funcs = b.build_losses(train_models)
    optimizers = b.build_optimizers(train_models, loss_funcs)
    batch, ipe, epochs = int(cfg["batch_size"]), int(cfg["iterations_per_epoch"]), int(cfg["num_epochs"])
    ckpt = Checkpointer(stage_dir, epoch_tables={"accuracies_val"})
    loop = EpochLoop(
        ckpt,
        train_models,
        optimizers,
        loss_funcs,
        num_epochs=epochs,
        primary="epoch",
        evaluate=lambda epoch: {"val": {"epoch": float(epoch)}},  # no selection: the last epoch is "best"
        best_path=os.path.join(stage_dir, "last_models.pth"),
        patience=None,
        check_untrained=False,
        log=lambda line: log(f"  {line}"),
        name=f"[{name} seed {seed}]",
        where=b.where("num_epochs"),
    )
    if loop.resume() is None:
        seed_everything(seed)  # the same batches for every loss of this seed

    def new_sampler():
        return b.build_sampler(train_view.labels, batch, ipe)

    def make_trainer():
        name_, kwargs = one_spec(cfg.get("trainer"), b.where("trainer"), default="MetricLossOnly")
        kwargs = dict(kwargs, batch_size=batch, iterations_per_epoch=ipe, dataloader_num_workers=0)
        return b.build_trainer(
            {name_: kwargs},
            models=train_models,
            optimizers=optimizers,
            loss_funcs=loss_funcs,
            mining_funcs=mining_funcs,
            dataset=train_view,
            sampler=None,  # the loop gives every epoch its sampler
            data_device=device,
            end_of_iteration_hook=loop.end_of_iteration,
            end_of_epoch_hook=lambda trainer: True,
        )

    start = time.time()
    loop.run(make_trainer, new_sampler)
    seconds = time.time() - start
    losses = [float(r["total_loss"]) for r in ckpt.rows("loss_histories") if r.get("total_loss") is not None]
    if not losses:
        raise ConfigError(f"{b.where('num_epochs')}: [{name} seed {seed}] logged no training loss")
    for m in models.values():
        m.eval()
    return {
        "models": models,
        "loss_start": float(np.mean(losses[:10])),
        "loss_end": float(np.mean(losses[-10:])),
        "train_seconds": seconds,
    }


def load_models(cfg, seed, stage_dir, sample, device, sources=None) -> Dict[str, torch.nn.Module]:
    """A finished unit's fine-tuned models, rebuilt and loaded (``weights_only=True``)."""
    from pml_extensions.runner.experiment.checkpoint import load_weights

    b = Builder(cfg, sources, device, lambda *a, **k: None)
    models = build_models(b, seed, sample)
    trunk = training_trunk(b, models["trunk"], cfg.get("frozen_prefix"))  # the layout the weights were saved in
    state = load_weights(os.path.join(stage_dir, "last_models.pth"), device)
    trunk.load_state_dict(state["trunk"])
    models["embedder"].load_state_dict(state["embedder"])
    for m in models.values():
        m.eval()
    return models
