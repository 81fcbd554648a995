"""The config keys of distillation in a training unit (the ``paired`` protocol's; "A student from a teacher
checkpoint, by config" in docs/methods/resolution_distillation.md), registered as
:func:`~pml_extensions.utils.wiring.unit_step` hooks so that the runner never names them:

- ``teacher``: a finished run's checkpoint (``{seed}`` becomes the unit's seed) or ``{checkpoint, init_student}``:
  the frozen teacher a distilling trainer (a class with ``teacher_modules``, e.g.
  :class:`~.resolution_distillation_trainer.ResolutionDistillationTrainer`) gets; the student starts from its
  weights unless ``init_student: false``; with an asymmetric tester (one that takes ``reference_dataset_dict``) the
  teacher embeds the references with ``transforms.reference``;
- ``coupled_augmentation``: the training set as :class:`CoupledAugmentationDataset` views of the training images.
"""

import functools
import inspect
import os
from typing import Any, Dict, Optional, Tuple

import torch

from ..utils.wiring import KeyProblem, Reference, unit_step

#: what a distilling trainer's missing key should say
HINTS = {
    "teacher": "<checkpoint of a finished run, e.g. experiments/teacher/teacher/seed_{seed}>",
    "coupled_augmentation": "{query_size: <student px>, database_size: <teacher px>}",
}


def teacher_spec(cfg: Dict[str, Any]) -> Optional[Tuple[str, bool]]:
    """``(checkpoint, init_student)`` of the config's ``teacher`` (a path, or ``{checkpoint, init_student}``;
    ``init_student`` defaults to true), ``None`` without one.

    Raises:
        KeyProblem: ``teacher: expected ...`` for any other value.
    """
    spec = cfg.get("teacher")
    if spec is None:
        return None
    if isinstance(spec, str) and spec:
        return spec, True
    if isinstance(spec, dict) and isinstance(spec.get("checkpoint"), str) and spec["checkpoint"]:
        unknown = sorted(set(spec) - {"checkpoint", "init_student"})
        init = spec.get("init_student", True)
        if not unknown and isinstance(init, bool):
            return spec["checkpoint"], init
    raise KeyProblem(
        "teacher", f"expected a checkpoint path or {{checkpoint: PATH, init_student: true|false}}, got {spec!r}"
    )


def distils(b) -> bool:
    """Whether the config's trainer distils from a teacher (its class has ``teacher_modules``)."""
    return callable(getattr(b.spec_class("trainer", "MetricLossOnly"), "teacher_modules", None))


def asymmetric_tester(b) -> bool:
    """Whether the config's tester embeds references with other models (it takes ``reference_dataset_dict``)."""
    tester = b.spec_class("tester", "GlobalEmbeddingSpaceTester")
    return "reference_dataset_dict" in inspect.signature(tester).parameters


@functools.lru_cache(maxsize=1)  # a seed's units, tests and examples share one load (units run seed after seed)
def _frozen_teacher(path: str, device: Any, stamp: Optional[float], load_run_models) -> Dict[str, torch.nn.Module]:
    trunk, embedder = load_run_models(path)
    out = {"teacher_trunk": trunk, "teacher_embedder": embedder}
    for m in out.values():
        m.to(device).eval().requires_grad_(False)
    return out


def load_teacher(b, seed: int, load_run_models) -> Optional[Dict[str, torch.nn.Module]]:
    """``{"teacher_trunk", "teacher_embedder"}`` of the config's ``teacher`` of ``seed`` (read by
    ``load_run_models``), frozen, on the Builder's device; ``None`` without one.

    Raises:
        KeyProblem: ``teacher: ...`` for a missing or unreadable checkpoint.
    """
    spec = teacher_spec(b.config)
    if spec is None:
        return None
    path = spec[0].replace("{seed}", str(seed))
    try:  # (a rewritten checkpoint has a new modification time: it loads again)
        stamp = os.path.getmtime(path) if os.path.exists(path) else None
        return _frozen_teacher(path, b.device, stamp, load_run_models)
    except FileNotFoundError as e:
        raise KeyProblem("teacher", f"{e} (train the teacher first, or name a finished run)") from None
    except (OSError, ValueError) as e:
        raise KeyProblem("teacher", str(e)) from None


def require_reference(b) -> None:
    """Refuse an asymmetric test with a teacher but without ``transforms.reference`` (the references' transform)."""
    if (b.get("transforms") or {}).get("reference") is None:
        raise KeyProblem(
            "transforms",
            "an asymmetric tester with a teacher needs transforms.reference (the teacher's database images, e.g. "
            "{Resize: {size: [32, 32]}})",
        )


@unit_step("check")
def check(b, seeds, load_run_models, memo: set) -> None:
    """A distilling trainer's ``teacher`` and ``coupled_augmentation``; a ``teacher`` loads for every seed (each
    checkpoint path once: ``memo``, the paths that loaded, shared by the variants)."""
    spec = teacher_spec(b.config)
    if distils(b):
        name, kwargs = next(iter(b.get("trainer").items()))
        missing = [k for k in ("teacher", "coupled_augmentation") if b.get(k) is None]
        if missing:
            raise KeyProblem(
                "trainer", f"{name} distils from a teacher: set " + " and ".join(f"{k}: {HINTS[k]}" for k in missing)
            )
        if "init_student_from_teacher" in (kwargs or {}):
            raise KeyProblem(
                f"trainer.{name}.init_student_from_teacher",
                "the runner initialises the student once, before a resume; use teacher: {checkpoint: ..., "
                "init_student: true|false}",
            )
    if b.get("coupled_augmentation") is not None:  # its arguments, checked on no images
        b.build("coupled_augmentation", {"CoupledAugmentationDataset": b.get("coupled_augmentation")}, dataset=[])
    if spec is not None:
        if asymmetric_tester(b):
            require_reference(b)
        if b.get("feature_cache") is not None:
            raise KeyProblem("teacher", "a teacher and feature_cache together are not supported")
        for seed in seeds if "{seed}" in spec[0] else seeds[:1]:
            path = spec[0].replace("{seed}", str(seed))
            if path not in memo:
                load_teacher(b, seed, load_run_models)
                memo.add(path)


@unit_step("train_set")
def coupled_views(b, indices, labels, seed: int):
    """With ``coupled_augmentation``: P coupled views per training image, small (student) and large (teacher)."""
    coupled = b.get("coupled_augmentation")
    if coupled is None:
        return None
    raw = b.subset(b.build_dataset("train"), indices, labels, rgb=True)
    return b.build("coupled_augmentation", {"CoupledAugmentationDataset": {"seed": seed, **coupled}}, dataset=raw)


@unit_step("prepare")
def init_student(b, models: Dict[str, Any], seed: int, load_run_models) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The student (``models``' trunk and embedder) initialised from the teacher of ``seed`` unless
    ``init_student: false`` (once, before any resume); a distilling trainer's frozen teacher models and
    ``init_student_from_teacher=False``.

    Raises:
        KeyProblem: ``teacher: the teacher's <key> does not fit models.<key> ...``.
    """
    teacher = load_teacher(b, seed, load_run_models)
    if teacher is None:
        return {}, {}
    if teacher_spec(b.config)[1]:
        for key in ("trunk", "embedder"):
            try:
                models[key].load_state_dict(teacher[f"teacher_{key}"].state_dict())
            except RuntimeError as e:
                raise KeyProblem(
                    "teacher",
                    f"the teacher's {key} does not fit models.{key} ({str(e).splitlines()[0]}); give the student the "
                    "teacher's architecture or set teacher.init_student: false",
                ) from None
    return (teacher, {"init_student_from_teacher": False}) if distils(b) else ({}, {})


@unit_step("reference")
def teacher_references(b, seed: int, split: str, source: str, indices, data, load_run_models) -> Optional[Reference]:
    """An asymmetric test's reference side: the teacher of ``seed`` embeds items ``indices`` of split ``source``
    (``data``: that split, already built, or None) with ``transforms.reference``; ``None`` without a teacher or an
    asymmetric tester (the student alone, on both sides)."""
    teacher = load_teacher(b, seed, load_run_models) if asymmetric_tester(b) else None
    if teacher is None:
        return None
    require_reference(b)
    data = b.build_dataset(source) if data is None else data
    views = b.subset(data, indices, None, b.build_transform("reference"))
    words = "the teacher's references (transforms.reference)"
    return Reference(teacher["teacher_trunk"], teacher["teacher_embedder"], {split: views}, words)


@unit_step("describe")
def describe(builders: Dict[str, Any]) -> str:
    """The variants (name -> Builder) that start from a frozen teacher, and whether their metrics are asymmetric."""
    teachers = {n: b for n, b in builders.items() if b.get("teacher") is not None}
    if not teachers:
        return ""
    b = next(iter(teachers.values()))
    names = ", ".join(f"`{n}`" for n in teachers)
    text = f"{names} start from the frozen teacher `{teacher_spec(b.config)[0]}` (their epoch 0 is the teacher on "
    # (the preflight refused an asymmetric tester with a teacher but without transforms.reference)
    return text + (
        "their images); their metrics are asymmetric: the variant embeds the queries (`transforms.eval`), the "
        "teacher the same images as references (`transforms.reference`)."
        if asymmetric_tester(b)
        else "their images)."
    )
