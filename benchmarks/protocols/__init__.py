"""The paper reproductions as runner plugins (powerful-benchmarker's ``register``, OML's ``pipelines/``): each
sub-package is a protocol whose configs (``benchmarks/configs/``) name it by its dotted path, e.g. ``protocol:
benchmarks.protocols.template_block``, which the command line imports when it runs from the repository's root.
A benchmark script run as ``python benchmarks/<script>.py`` imports this package as ``protocols`` and calls
:func:`register` first, so the same configs find their protocols under either name."""

import importlib

PLUGINS = ("template_block", "localization", "resolution_distillation", "xml_paper")


def register() -> None:
    """Register every plugin under its dotted name ``benchmarks.protocols.<name>``."""
    from pml_extensions.runner.protocols import register_protocol

    for name in PLUGINS:
        module = importlib.import_module(f"{__name__}.{name}")
        register_protocol(f"benchmarks.protocols.{name}", module.PROTOCOL)
