"""The stages of the resolution-distillation protocol (RAML, Suma & Tolias, WACV 2023): a teacher-recipe model at
one resolution, one distilled student (with its validation selection), and the per-seed choice of the student
learning rate. The protocol (:mod:`pml_extensions.runner.protocols.resolution_distillation`) runs them in order per
(dataset, seed); its module docstring gives the pairing, selection and resume rules.
"""

import os
from typing import Dict

import torch

from ....datasets.coupled_augmentation_dataset import CoupledAugmentationDataset, PassShuffleSampler
from ....losses.resolution_distillation_loss import ResolutionDistillationLoss
from ....trainers.resolution_distillation_trainer import ResolutionDistillationTrainer, make_optimizers
from ....trainers.teacher_recipe import make_teacher_trainer
from ....utils.atomic_io import atomic_torch_save
from ...experiment.checkpoint import load_weights
from ...experiment.folder import seed_everything
from . import tables as parts

#: student variants (Tables 3-4); "full" is the paper's student and the baseline of every comparison
STUDENT_VARIANTS: Dict[str, dict] = {
    "full": {},
    "loss_abs_only": {"loss": {"lambda_abs": 1.0, "lambda_ts": 0.0, "lambda_ss": 0.0}},
    "loss_rel_ts_only": {"loss": {"lambda_abs": 0.0, "lambda_ts": 1.0, "lambda_ss": 0.0}},
    "loss_rel_ss_only": {"loss": {"lambda_abs": 0.0, "lambda_ts": 0.0, "lambda_ss": 1.0}},
    "augment_uncoupled": {"augment": {"coupled": False}},
    "augment_no_geometric": {"augment": {"scale": (1.0, 1.0), "ratio": (1.0, 1.0), "flip_p": 0.0}},
    "augment_no_colour": {"augment": {"jitter_strength": 0.0}},
    "augment_no_mixup": {"augment": {"mixup_alpha": None}},
    "init_imagenet": {"init": "imagenet"},
    "init_low_resolution_teacher": {"init": "low_resolution_teacher"},
}


def finish(exp, stage, result):
    """Mark ``stage`` finished and drop its training checkpoint (its logs, result and models.pth stay)."""
    exp.finish_stage(stage, result, rank_local=True)  # each stage belongs to the one rank running its seed
    path = os.path.join(exp.stage_folder(stage), "checkpoint.pth")
    if os.path.exists(path):
        os.remove(path)
    return result


def evaluate_rows(
    tester, make_dataset_dict, teacher, student, q, db, setups, fields, teacher_resolution=None, rename=None
):
    """Rows ``fields + {setup, resolutions, query_flops, metrics}``, one per setup, on the one split of
    ``make_dataset_dict(resolution)`` (the test classes, or the validation classes during selection)."""
    out = tester.evaluate_setups(make_dataset_dict, teacher, student, q, db, teacher_resolution, setups=setups)
    rows = []
    for setup, res in out.items():
        row = dict(
            fields,
            setup=(rename or {}).get(setup, setup),
            query_resolution=res["query_resolution"],
            database_resolution=db,
            reference_resolution=res["reference_resolution"],
            query_flops=int(res["query_flops"]),
        )
        (split,) = res["accuracies"]
        row.update(parts.metrics_of(res["accuracies"][split]))
        rows.append(row)
    return rows


def teacher_stage(exp, stage, ctx, resolution, job):
    """Train (or load) a teacher-recipe model at ``resolution`` from ImageNet; returns (trunk, embedder)."""
    seed, device = ctx["seed"], exp.device
    seed_everything(seed)
    trunk, embedder = (m.to(device) for m in parts.build_model(job["embedding_dim"]))
    path = os.path.join(exp.stage_folder(stage), "models.pth")
    if exp.stage_result(stage) is not None:
        weights = load_weights(path, device)
        trunk.load_state_dict(weights["trunk"])
        embedder.load_state_dict(weights["embedder"])
        return trunk.eval(), embedder.eval()
    data = parts.Transformed(
        ctx["train_set"],
        range(len(ctx["train_set"])),
        parts.train_transform(resolution, ctx["dcfg"].get("crop_scale", (0.08, 1.0))),
    )
    chunks = None
    if job["teacher_iterations"] > 0:
        chunks_ = {}
        models = {"trunk": trunk, "embedder": embedder}

        trainer = make_teacher_trainer(
            trunk,
            embedder,
            data,
            lr=job["teacher_lr"],
            classes_per_batch=job["teacher_classes_per_batch"],
            iterations_per_epoch=job["checkpoint_every"] or job["teacher_iterations"],
            data_device=device,
            dataloader_num_workers=job["num_workers"],
            end_of_iteration_hook=lambda t: chunks_["c"].end_of_iteration_hook(t),
            end_of_epoch_hook=lambda t: chunks_["c"].end_of_epoch_hook(t),
        )
        trainer.freeze_trunk_batchnorm = True
        chunks = parts.Chunks(
            exp,
            stage,
            models,
            trainer.optimizers,
            {},
            job["teacher_iterations"],
            job["checkpoint_every"],
            reseed=lambda epoch: seed_everything(seed * 100_003 + epoch),
        )
        chunks_["c"] = chunks
        chunks.train(trainer, chunks.resume(trainer))
    trunk.eval(), embedder.eval()
    atomic_torch_save({"trunk": trunk.state_dict(), "embedder": embedder.state_dict()}, path)
    return trunk, embedder


def build_student(ctx, q, variant, job, teacher, low_res_teacher=None, device="cpu", hooks=None):
    """The :class:`ResolutionDistillationTrainer` of one student variant (not trained yet).

    Within a seed (``ctx["seed"]``) every variant starts from the same weights for its initialisation (the teacher,
    the low-resolution teacher, or ImageNet + a head drawn after ``seed_everything(seed)``) and sees the same
    batches (:class:`PassShuffleSampler`) and augmentation draws (keyed by (seed, pass, index)) unless the variant
    changes the augmentations. ``hooks``: ``(end_of_iteration_hook, end_of_epoch_hook)``. The one-cycle schedulers
    span ``student_iterations`` (``trainer.lr_schedulers``).
    """
    seed, spec = ctx["seed"], STUDENT_VARIANTS[variant]
    seed_everything(seed)  # the ImageNet-init head; every other init overwrites it
    init = spec.get("init", "teacher")
    trunk, embedder = (m.to(device) for m in parts.build_model(job["embedding_dim"], pretrained=(init == "imagenet")))
    if init == "low_resolution_teacher":
        trunk.load_state_dict(low_res_teacher[0].state_dict())
        embedder.load_state_dict(low_res_teacher[1].state_dict())
    models = {"trunk": trunk, "embedder": embedder, "teacher_trunk": teacher[0], "teacher_embedder": teacher[1]}
    augment = dict(
        num_augmentations=job["num_augmentations"], scale=tuple(ctx["dcfg"].get("crop_scale", (0.08, 1.0))), seed=seed
    )
    augment.update(spec.get("augment", {}))
    data = CoupledAugmentationDataset(ctx["train_set"], q, ctx["db"], **augment)
    weights = {"lambda_ts": job["lambda_ts"], "lambda_ss": job["lambda_ss"]}
    weights.update(spec.get("loss", {}))
    if init == "teacher":  # the trainer's own copy, done here so that the optimizers see the final weights
        trunk.load_state_dict(teacher[0].state_dict())
        embedder.load_state_dict(teacher[1].state_dict())
    optimizers = make_optimizers(trunk, embedder, lr=job["lr"])
    total = job["student_iterations"]
    schedulers = {
        f"{name[: -len('_optimizer')]}_scheduler_by_iteration": torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=total, div_factor=10.0
        )
        for name, opt in optimizers.items()
    }
    iteration_hook, epoch_hook = hooks or (None, None)
    kwargs = {} if hooks is None else {"end_of_iteration_hook": iteration_hook, "end_of_epoch_hook": epoch_hook}
    return ResolutionDistillationTrainer(
        models,
        optimizers,
        job["images_per_batch"],
        {"distillation_loss": ResolutionDistillationLoss(**weights)},
        data,
        init_student_from_teacher=False,
        new_pass_each_epoch=True,
        lr_schedulers=schedulers,
        sampler=PassShuffleSampler(len(data), seed=seed),
        iterations_per_epoch=job["checkpoint_every"] or total,
        data_device=device,
        dataloader_num_workers=job["num_workers"],
        **kwargs,
    )


def student_stage(exp, stage, ctx, q, variant, job, teacher, low_res_teacher=None, curve=False, lr=None):
    """Distil (or skip when finished) one student; returns the stage result ``{"rows", "curve", "selection"}``.

    ``lr``: the student's learning rate (default ``job["lr"]``). With a validation split
    (``ctx["make_validation_dict"]``)
    the asymmetric and symmetric MAP@R on the validation classes are measured at iteration 0 and after every chunk,
    the weights with the best validation asymmetric MAP@R are kept (``best_models.pth``; the earliest on a tie) and
    only those are evaluated on the test classes; ``selection`` = ``{"lr", "iteration", "validation", "curve"}``.
    Without one, the last weights are evaluated (a fixed schedule). The test-set ``curve`` (``curve=True``) is
    reported, never used for a choice.
    """
    done = exp.stage_result(stage)
    if done is not None:
        return done
    lr = job["lr"] if lr is None else lr
    holder = {}
    trainer = build_student(
        ctx,
        q,
        variant,
        dict(job, lr=lr),
        teacher,
        low_res_teacher,
        exp.device,
        hooks=(lambda t: holder["c"].end_of_iteration_hook(t), lambda t: holder["c"].end_of_epoch_hook(t)),
    )
    trunk, embedder = trainer.models["trunk"], trainer.models["embedder"]
    fields = {"dataset": ctx["dataset"], "seed": ctx["seed"], "student_variant": variant}
    setups = ("teacher_student_asymmetric", "student_symmetric")
    validate = ctx.get("make_validation_dict")
    best_path = os.path.join(exp.stage_folder(stage), "best_models.pth")

    def evaluate(make_dataset_dict):
        return evaluate_rows(ctx["tester"], make_dataset_dict, teacher, (trunk, embedder), q, ctx["db"], setups, fields)

    def observe(it, extra):
        """Score the student at iteration ``it`` (test curve, validation); returns ``{log key: value}``."""
        scores = {}
        if curve:
            points = [dict(r, iteration=it) for r in evaluate(ctx["make_dataset_dict"])]
            extra.setdefault("curve", []).extend(points)
            scores.update({f"{p['setup']}_{parts.PRIMARY}": p[parts.PRIMARY] for p in points})
        if validate is not None:
            rows = {r["setup"]: r[parts.PRIMARY] for r in evaluate(validate)}
            extra.setdefault("validation_curve", []).append(dict(rows, iteration=it))
            scores.update({f"validation_{k}_{parts.PRIMARY}": v for k, v in rows.items()})
            best = extra.get("best")
            if best is None or rows["teacher_student_asymmetric"] > best["validation"]:
                atomic_torch_save({"trunk": trunk.state_dict(), "embedder": embedder.state_dict()}, best_path)
                extra["best"] = {"iteration": it, "validation": rows["teacher_student_asymmetric"]}
        return scores

    def on_chunk(trainer, chunks):
        it = trainer.epoch * chunks.chunk
        scores = observe(it, chunks.extra)
        if scores:
            chunks.ck.record_keeper.update_records({"accuracies": dict(scores, iteration=it)}, trainer.epoch)

    chunks = parts.Chunks(
        exp,
        stage,
        {"trunk": trunk, "embedder": embedder},
        trainer.optimizers,
        trainer.lr_schedulers,
        job["student_iterations"],
        job["checkpoint_every"],
        on_chunk=on_chunk,
    )
    holder["c"] = chunks
    start = chunks.resume(trainer)
    if start == 1:  # iteration 0: the initial student
        observe(0, chunks.extra)
    chunks.train(trainer, start)
    selection = None
    if validate is not None:
        best = chunks.extra["best"]
        weights = load_weights(best_path, exp.device)
        trunk.load_state_dict(weights["trunk"])
        embedder.load_state_dict(weights["embedder"])
        selection = {
            "lr": lr,
            "iteration": best["iteration"],
            "validation": best["validation"],
            "curve": list(chunks.extra["validation_curve"]),
        }
        if best["iteration"] == 0:
            exp.log(f"warning: {stage}: the best validation checkpoint is the undistilled student (iteration 0)")
    trunk.eval(), embedder.eval()
    # the student's (selected) weights beside the teacher's (``explain --checkpoint <stage>/models.pth``)
    atomic_torch_save(
        {"trunk": trunk.state_dict(), "embedder": embedder.state_dict()},
        os.path.join(exp.stage_folder(stage), "models.pth"),
    )
    result = {
        "rows": evaluate(ctx["make_dataset_dict"]),
        "curve": list(chunks.extra.get("curve", [])),
        "selection": selection,
    }
    return finish(exp, stage, result)


def choose_student_lr(exp, ctx, job, teacher, low, base):
    """The student learning rate of one (dataset, seed): the full student at the ablation query resolution is
    distilled once per ``student_lr_grid`` entry and the rate whose selected checkpoint has the best validation
    asymmetric MAP@R wins (the first on a tie). Returns ``(lr, {lr: stage result})``; without a grid ``job["lr"]``."""
    if not job["student_lr_grid"]:
        return job["lr"], {}
    aq = ctx["dcfg"]["ablation_query_resolution"]
    tried = {}
    for lr in job["student_lr_grid"]:
        tried[lr] = student_stage(
            exp, f"{base}/student_{aq}px_full_lr{lr:g}", ctx, aq, "full", job, teacher, low.get(aq), curve=True, lr=lr
        )
        exp.log(
            f"[{ctx['dataset']}] seed {ctx['seed']} {aq}px student lr {lr:g}: validation asymmetric MAP@R "
            f"{tried[lr]['selection']['validation']:.4f} at iteration {tried[lr]['selection']['iteration']}"
        )
    best = max(tried, key=lambda lr: tried[lr]["selection"]["validation"])  # max keeps the first of equals
    return best, tried
