"""The students of the resolution-distillation protocol: one distilled student (with its validation selection),
and the per-seed choice of the student learning rate.

A student (Suma & Tolias, WACV 2023, Sec. 4) is the config's ``models`` initialised from the seed's teacher (or
ImageNet, or the low-resolution teacher: :data:`~.recipe.STUDENT_VARIANTS`) and distilled label-free from the frozen
teacher on coupled augmentations, by :class:`pml_extensions.trainers.ResolutionDistillationTrainer`. Every object
comes from the protocol's :class:`pml_extensions.runner.objects.builder.Builder` (``ctx["builder"]``). The protocol
(:mod:`.protocol`) runs the stages in order per (dataset, seed); its module docstring gives the pairing, selection
and resume rules.
"""

import os

from pml_extensions.runner.experiment.checkpoint import load_weights
from pml_extensions.runner.experiment.folder import seed_everything
from pml_extensions.utils.atomic_io import atomic_torch_save

from . import recipe
from .chunks import Chunks, finish
from .evaluation import PRIMARY, evaluate_rows
from .recipe import STUDENT_VARIANTS

__all__ = ["STUDENT_VARIANTS", "build_student", "choose_student_lr", "student_stage"]


def build_student(ctx, q, variant, job, teacher, low_res_teacher=None, device="cpu", hooks=None):
    """The :class:`ResolutionDistillationTrainer` of one student variant (not trained yet).

    Within a seed (``ctx["seed"]``) every variant starts from the same weights for its initialisation (the teacher,
    the low-resolution teacher, or ImageNet + a head drawn after ``seed_everything(seed)``) and sees the same
    batches (:class:`PassShuffleSampler`) and augmentation draws (keyed by (seed, pass, index)) unless the variant
    changes the augmentations. ``hooks``: ``(end_of_iteration_hook, end_of_epoch_hook)``. The one-cycle schedulers
    span ``student_iterations`` (``trainer.lr_schedulers``). ``ctx["builder"]`` builds every object (a CPU
    Builder when the context has none); ``device`` is where the student is trained.
    """
    from pml_extensions.runner.objects.builder import Builder

    builder = ctx.get("builder") or Builder({}, device=device)
    seed, spec = ctx["seed"], STUDENT_VARIANTS[variant]
    seed_everything(seed)  # the ImageNet-init head; every other init overwrites it
    init = spec.get("init", "teacher")
    models = builder.build_models(spec=recipe.with_pretrained(job["models"], init == "imagenet"))
    trunk, embedder = models["trunk"], models["embedder"]
    if init == "low_resolution_teacher":
        trunk.load_state_dict(low_res_teacher[0].state_dict())
        embedder.load_state_dict(low_res_teacher[1].state_dict())
    models = {"trunk": trunk, "embedder": embedder, "teacher_trunk": teacher[0], "teacher_embedder": teacher[1]}
    augment = dict(
        num_augmentations=job["num_augmentations"], scale=tuple(ctx["dcfg"].get("crop_scale", (0.08, 1.0))), seed=seed
    )
    augment.update(spec.get("augment", {}))
    data = builder.build(
        "student.dataset",
        {"CoupledAugmentationDataset": {"query_size": q, "database_size": ctx["db"], **augment}},
        dataset=ctx["train_set"],
    )
    weights = {"lambda_ts": job["lambda_ts"], "lambda_ss": job["lambda_ss"]}
    weights.update(spec.get("loss", {}))
    if init == "teacher":  # the trainer's own copy, done here so that the optimizers see the final weights
        trunk.load_state_dict(teacher[0].state_dict())
        embedder.load_state_dict(teacher[1].state_dict())
    student = {"trunk": trunk, "embedder": embedder}
    optimizers = builder.build_optimizers(student, {}, spec=recipe.optimizer_specs(job["lr"]))
    total = job["student_iterations"]
    schedulers = builder.build_lr_schedulers(optimizers, recipe.scheduler_specs(optimizers, total))
    loss_funcs, _ = builder.build_losses(
        student, loss_funcs={"distillation_loss": {"ResolutionDistillationLoss": weights}}, mining_funcs={}
    )
    iteration_hook, epoch_hook = hooks or (None, None)
    kwargs = {} if hooks is None else {"end_of_iteration_hook": iteration_hook, "end_of_epoch_hook": epoch_hook}
    return builder.build_trainer(
        {
            "ResolutionDistillationTrainer": {
                "batch_size": job["images_per_batch"],
                "init_student_from_teacher": False,
                "new_pass_each_epoch": True,
                "iterations_per_epoch": job["checkpoint_every"] or total,
                "dataloader_num_workers": job["num_workers"],
            }
        },
        models=models,
        optimizers=optimizers,
        loss_funcs=loss_funcs,
        dataset=data,
        lr_schedulers=schedulers,
        sampler=builder.build_sampler(
            spec={"PassShuffleSampler": {"num_items": len(data), "seed": seed}}, split_over_ranks=False
        ),
        data_device=device,
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
            scores.update({f"{p['setup']}_{PRIMARY}": p[PRIMARY] for p in points})
        if validate is not None:
            rows = {r["setup"]: r[PRIMARY] for r in evaluate(validate)}
            extra.setdefault("validation_curve", []).append(dict(rows, iteration=it))
            scores.update({f"validation_{k}_{PRIMARY}": v for k, v in rows.items()})
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

    chunks = Chunks(
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
