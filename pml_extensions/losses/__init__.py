"""Every PML loss (the very same class objects) plus the losses of pml_extensions.

``from pml_extensions import losses`` is a drop-in for ``from pytorch_metric_learning import losses``.
"""

import pytorch_metric_learning.losses as _pml_losses

from .patch_classification_loss import PatchClassificationLoss
from .resolution_distillation_loss import ResolutionDistillationLoss
from .xml_wrapper import XMLWrapper

PML_LOSSES = sorted(
    name for name, obj in vars(_pml_losses).items() if isinstance(obj, type) and not name.startswith("_")
)
globals().update({name: getattr(_pml_losses, name) for name in PML_LOSSES})

__all__ = PML_LOSSES + ["PatchClassificationLoss", "ResolutionDistillationLoss", "XMLWrapper"]
