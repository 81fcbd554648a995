"""The teacher stage of the resolution-distillation protocol: a network trained with the paper's teacher recipe at
one resolution (the database resolution, or a query resolution for Table 2's block 1), resumable after SIGKILL.

Every object comes from the protocol's :class:`pml_extensions.runner.objects.builder.Builder` (``ctx["builder"]``):
the config's ``models``, the recipe's training transform, triplet loss + distance-weighted miner, ``MPerClassSampler``,
AdamW with GeM's ``p`` apart and PML's ``MetricLossOnly`` (:mod:`.recipe`). Chunks of ``checkpoint_every``
iterations reseed torch/numpy/PML's RNGs from (seed, chunk) and checkpoint the order of the sampler's label list, so
a killed teacher resumes exactly.
"""

import os

import numpy as np

from pml_extensions.runner.experiment.checkpoint import load_weights
from pml_extensions.runner.experiment.folder import seed_everything
from pml_extensions.utils.atomic_io import atomic_torch_save

from . import recipe
from .chunks import Chunks


def teacher_stage(exp, stage, ctx, resolution, job):
    """Train (or load) a teacher-recipe model at ``resolution`` from ImageNet; returns (trunk, embedder)."""
    seed, device, builder = ctx["seed"], exp.device, ctx["builder"]
    seed_everything(seed)
    models = builder.build_models(spec=recipe.with_pretrained(job["models"], True))
    trunk, embedder = models["trunk"], models["embedder"]
    path = os.path.join(exp.stage_folder(stage), "models.pth")
    if exp.stage_result(stage) is not None:
        weights = load_weights(path, device)
        trunk.load_state_dict(weights["trunk"])
        embedder.load_state_dict(weights["embedder"])
        return trunk.eval(), embedder.eval()
    train_set = ctx["train_set"]
    transform = builder.build_transform(
        spec=recipe.train_transform_spec(resolution, ctx["dcfg"].get("crop_scale", (0.08, 1.0)))
    )
    data = builder.subset(train_set, np.arange(len(train_set)), transform=transform, rgb=True)
    if job["teacher_iterations"] > 0:
        holder = {}
        models = {"trunk": trunk, "embedder": embedder}
        batch_size = recipe.IMAGES_PER_CLASS * job["teacher_classes_per_batch"]
        loss_funcs, mining_funcs = builder.build_losses(
            models, loss_funcs=recipe.TEACHER_LOSS, mining_funcs=recipe.TEACHER_MINER
        )
        trainer = builder.build_trainer(
            {
                "MetricLossOnly": {
                    "batch_size": batch_size,
                    "iterations_per_epoch": job["checkpoint_every"] or job["teacher_iterations"],
                    "dataloader_num_workers": job["num_workers"],
                    "freeze_trunk_batchnorm": True,
                }
            },
            models=models,
            optimizers=builder.build_optimizers(models, {}, spec=recipe.optimizer_specs(job["teacher_lr"])),
            loss_funcs=loss_funcs,
            mining_funcs=mining_funcs,
            dataset=data,
            sampler=builder.build_sampler(
                data.labels, batch_size, spec=recipe.teacher_sampler_spec(len(data)), split_over_ranks=False
            ),
            data_device=device,
            end_of_iteration_hook=lambda t: holder["c"].end_of_iteration_hook(t),
            end_of_epoch_hook=lambda t: holder["c"].end_of_epoch_hook(t),
        )
        chunks = Chunks(
            exp,
            stage,
            models,
            trainer.optimizers,
            {},
            job["teacher_iterations"],
            job["checkpoint_every"],
            reseed=lambda epoch: seed_everything(seed * 100_003 + epoch),
        )
        holder["c"] = chunks
        chunks.train(trainer, chunks.resume(trainer))
    trunk.eval(), embedder.eval()
    atomic_torch_save({"trunk": trunk.state_dict(), "embedder": embedder.state_dict()}, path)
    return trunk, embedder
