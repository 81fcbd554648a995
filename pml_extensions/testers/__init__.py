"""Every PML tester (the same class objects) plus the testers of pml_extensions."""

import pytorch_metric_learning.testers as _pml_testers

PML_TESTERS = sorted(
    name for name, obj in vars(_pml_testers).items() if isinstance(obj, type) and not name.startswith("_")
)
globals().update({name: getattr(_pml_testers, name) for name in PML_TESTERS})

from .asymmetric_tester import AsymmetricTester  # noqa: E402
from .sharded_tester import ShardedGlobalEmbeddingSpaceTester  # noqa: E402

__all__ = PML_TESTERS + ["AsymmetricTester", "ShardedGlobalEmbeddingSpaceTester"]
