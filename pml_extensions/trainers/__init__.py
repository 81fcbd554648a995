"""Every PML trainer (the same class objects) plus the trainers of pml_extensions."""

import pytorch_metric_learning.trainers as _pml_trainers

PML_TRAINERS = sorted(
    name for name, obj in vars(_pml_trainers).items() if isinstance(obj, type) and not name.startswith("_")
)
globals().update({name: getattr(_pml_trainers, name) for name in PML_TRAINERS})

__all__ = list(PML_TRAINERS)
