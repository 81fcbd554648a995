"""The paper reproductions as runner plugins (powerful-benchmarker's ``register``, OML's ``pipelines/``): each
sub-package is a protocol whose configs (``benchmarks/configs/``) name it by its dotted path, e.g. ``protocol:
benchmarks.protocols.template_block``, which the command line imports when it runs from the repository's root.
A benchmark script run as ``python benchmarks/<script>.py`` imports this package as ``protocols`` and calls
:func:`register` first, so the same configs find their protocols under either name; :func:`config_path` is where a
config of ``benchmarks/configs/`` lies, wherever the script was started."""

import importlib
import os

PLUGINS = ("template_block", "localization", "resolution_distillation", "xml_paper")
#: ``benchmarks/configs``: the configs of the paper reproductions (found by path, not shipped with the package)
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def register() -> None:
    """Register every plugin under its dotted name ``benchmarks.protocols.<name>`` (its sub-package is then an
    attribute of this package, e.g. ``protocols.template_block``)."""
    from pml_extensions.runner.protocols import register_protocol

    for name in PLUGINS:
        module = importlib.import_module(f"{__name__}.{name}")
        register_protocol(f"benchmarks.protocols.{name}", module.PROTOCOL)


def config_path(name: str) -> str:
    """The folder of the benchmark config ``name`` (``benchmarks/configs/<name>``).

    Raises:
        FileNotFoundError: no such config (the known ones listed).
    """
    path = os.path.join(CONFIGS, name)
    if not os.path.isdir(path):
        known = ", ".join(sorted(os.listdir(CONFIGS)))
        raise FileNotFoundError(f"benchmarks/configs/{name}: no such config (known: {known})")
    return path


def write_table(out_dir: str, name: str, data: dict, text: str, indent: int = 2) -> None:
    """Write a benchmark's ``NAME.json`` (``data``, JSON ``indent``) and ``NAME.md`` (``text``) into ``out_dir``
    atomically and print the table: the one tail of the benchmark scripts that write ``benchmarks/results``."""
    from pml_extensions.utils.atomic_io import atomic_write_json, atomic_write_text

    os.makedirs(out_dir, exist_ok=True)
    atomic_write_json(os.path.join(out_dir, f"{name}.json"), data, indent=indent)
    atomic_write_text(os.path.join(out_dir, f"{name}.md"), text)
    print(text)
