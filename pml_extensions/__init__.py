"""pml_extensions: recent deep-metric-learning methods inside pytorch-metric-learning (PML).

Subpackages mirror PML's (``losses``, ``trainers``, ``testers``, ``utils``) and add ``trunks`` (layers that go into a
trunk), ``datasets`` (offline real data) and ``runner`` (powerful-benchmarker-style YAML configs).
"""

__version__ = "0.1.0"
