"""Every PML trainer (the same class objects) plus the trainers of pml_extensions."""

import pytorch_metric_learning.trainers as _pml_trainers

PML_TRAINERS = sorted(
    name for name, obj in vars(_pml_trainers).items() if isinstance(obj, type) and not name.startswith("_")
)
globals().update({name: getattr(_pml_trainers, name) for name in PML_TRAINERS})

from . import distillation_keys  # noqa: E402, F401  (registers the unit steps of teacher and coupled_augmentation)
from .resolution_distillation_trainer import (  # noqa: E402
    ResolutionDistillationTrainer,
    gem_parameters,
    make_optimizers,
    make_teacher_trainer,
    set_batchnorm_eval,
)
from .template_matching_trainer import TemplateMatchingTrainer  # noqa: E402

__all__ = PML_TRAINERS + [
    "ResolutionDistillationTrainer",
    "TemplateMatchingTrainer",
    "gem_parameters",
    "make_optimizers",
    "make_teacher_trainer",
    "set_batchnorm_eval",
]
