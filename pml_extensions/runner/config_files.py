"""Read a folder of powerful-benchmarker-style YAML files (``config_*.yaml``) into one dict with ``yaml.safe_load``."""

import copy
import glob
import os
from typing import Any, Dict

import yaml

from .factory import ConfigError, is_object_spec

CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def find_config_dir(name_or_path: str) -> str:
    """A folder path, or the name of a config shipped in ``pml_extensions/configs``.

    Raises:
        ConfigError: naming what was looked for.
    """
    if os.path.isdir(name_or_path):
        return name_or_path
    shipped = os.path.join(CONFIGS_DIR, name_or_path)
    if os.path.isdir(shipped):
        return shipped
    available = sorted(os.listdir(CONFIGS_DIR)) if os.path.isdir(CONFIGS_DIR) else []
    raise ConfigError(f"config {name_or_path!r}: no such folder and no shipped config (shipped: {', '.join(available)})")


def load_yaml(path: str) -> Dict[str, Any]:
    """``yaml.safe_load`` one file; errors name the file."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: file not found") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: malformed YAML: {str(e).splitlines()[0]}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def deep_merge(base: Any, override: Any) -> Any:
    """Merge ``override`` into a copy of ``base``: dicts merge key by key; an object spec ``{ClassName: ...}``
    replaces one with a different class name (and merges kwargs when the class is the same); anything else is
    replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        if is_object_spec(base) and is_object_spec(override) and next(iter(base)) != next(iter(override)):
            return copy.deepcopy(override)
        merged = copy.deepcopy(base)
        for key, value in override.items():
            merged[key] = deep_merge(merged[key], value) if key in merged else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def load_config_dir(folder: str) -> Dict[str, Any]:
    """Merge every ``config_*.yaml`` of ``folder`` in name order; a key defined by two files is an error."""
    merged: Dict[str, Any] = {}
    origin: Dict[str, str] = {}
    files = sorted(glob.glob(os.path.join(folder, "config_*.yaml")))
    if not files:
        raise ConfigError(f"{folder}: no config_*.yaml files")
    for path in files:
        for key, value in load_yaml(path).items():
            if key in merged:
                raise ConfigError(f"{path}: key {key!r} is already defined in {origin[key]}")
            merged[key], origin[key] = value, path
    merged["_origin"] = origin
    return merged
