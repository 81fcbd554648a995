"""runner/__init__.py: the public names (every one exported before the floor plan still is) and the floor plan's
docstring. (Every ``>>>`` example of the package, the runner's included, runs in tests/test_docstring_examples.py.)"""

import os

import pml_extensions.runner as runner

#: the names pml_extensions.runner exported before the floor plan (issue 20: keep every public name)
BEFORE = (
    "CONFIG_FOLDERS",
    "Checkpointer",
    "ConfigError",
    "DistributedBatchSliceSampler",
    "MLP",
    "MLRCRunner",
    "ROLES",
    "build",
    "classes_for_role",
    "ensemble_metrics",
    "find",
    "load_config",
    "merge",
    "mlrc_class_splits",
    "parse_command_line",
    "register",
    "resolve",
    "write_report",
)


def test_public_names_are_kept():
    for name in BEFORE + ("Builder", "MissingDataError", "PROTOCOLS", "find_config", "run_protocol"):
        assert name in runner.__all__ and getattr(runner, name) is not None, name
    from pml_extensions.runner.config.registry import register
    from pml_extensions.runner.objects.builder import Builder

    assert runner.register is register and runner.Builder is Builder


def test_the_docstring_is_the_floor_plan():
    folders = sorted(
        n for n in os.listdir(os.path.dirname(runner.__file__)) if not n.startswith("__") and not n.endswith(".pyc")
    )
    assert folders == ["config", "errors.py", "experiment", "objects", "outputs", "protocols"]
    for name in folders:
        assert f"``{name.replace('.py', '')}{'' if name.endswith('.py') else '/'}" in runner.__doc__, name
