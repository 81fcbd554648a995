"""How a config's files merge: powerful-benchmarker (PB) syntax, two input forms, one merge.

A config is either PB's folders (one ``config_<category>/`` folder per :data:`CONFIG_FOLDERS` entry, a run selecting
the files merged in order, default ``[default]``) or the flat form (one ``config_<category>.yaml`` per category, its
``variants`` expanded by :func:`variant_configs`). The command line (:func:`parse_command_line`: ``--name value``
pairs, values in YAML) is merged last, with PB's markers (:mod:`pml_extensions.runner.config.syntax`). Every error is
a :class:`pml_extensions.runner.errors.ConfigError` whose one line starts with the file (or ``command line``).
"""

import copy
import importlib.util
import itertools
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from ..errors import ConfigError
from .sources import SHIPPED, Sources
from .syntax import find_search_markers, merge, split_marker
from .yaml_reader import read_yaml

CONFIG_FOLDERS = (
    "config_general",
    "config_models",
    "config_loss_and_miners",
    "config_optimizers",
    "config_transforms",
    "config_eval",
    "config_factories",
    "config_dataset",
)


def check_no_search(config: Dict, sources: Optional[Dict[str, str]] = None) -> None:
    """Refuse hyper-parameter search markers with one line naming the file and key of the first one."""
    found = find_search_markers(config)
    if not found:
        return
    top = found[0].split(".")[0]
    source = (sources or {}).get(top, "config")
    if importlib.util.find_spec("optuna") is not None:  # found without importing it
        reason = "search markers run an Optuna study only through `python -m pml_extensions run` (runner's search)"
    else:
        reason = "hyper-parameter search needs optuna, which is not installed (pip install optuna)"
    raise ConfigError(f"{source}: key {found[0]}: {reason}; replace the marker by a fixed value")


def _problem(error: yaml.YAMLError) -> str:
    """What PyYAML says is wrong, in one line."""
    return getattr(error, "problem", None) or str(error).splitlines()[0]


def _key_before_line(text: str, line: int) -> str:
    """The nearest key at or above ``line`` (0-based) in YAML text, for error messages."""
    lines = text.splitlines()
    for i in range(min(line, len(lines) - 1), -1, -1):
        m = re.match(r"^\s*([^\s#:\-][^:#]*?)\s*:(\s|$)", lines[i])
        if m:
            return m.group(1)
    return "<top>"


def load_yaml(path: str) -> Dict:
    """Load one YAML file as a dict (empty file -> ``{}``).

    Raises:
        ConfigError: ``"<path>: missing config file"``, ``"<path>:<line>: key <k>: malformed YAML: ..."`` or
            ``"<path>: top level must be a mapping"``.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"{display_path(path)}: missing config file")
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        data = read_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line if mark is not None else 0
        raise ConfigError(
            f"{display_path(path)}:{line + 1}: key {_key_before_line(text, line)!r}: malformed YAML: {_problem(e)}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{display_path(path)}: key <top>: top level must be a mapping, got {type(data).__name__}")
    return data


def parse_command_line(argv: Sequence[str]) -> Dict[str, Any]:
    """Parse ``--name value ...`` into a dict; values are YAML (``{a: 1}``, ``[x, y]``, ``0.1``, ``1e-3``, ``null``;
    floats in YAML 1.2's syntax, :func:`pml_extensions.runner.config.yaml_reader.read_yaml`).

    Raises:
        ConfigError: ``"command line: --name: ..."`` for values without a flag, malformed YAML values, or a flag given
        twice (the second would silently replace the first).
    """
    out: Dict[str, Any] = {}
    flag, words = None, []

    def close():
        if flag is None:
            return
        if flag in out:
            raise ConfigError(
                f"command line: --{flag}: given twice; give it once (a mapping takes several keys: "
                '--trainer~APPLY~2 "{batch_size: 16, iterations_per_epoch: 10}")'
            )
        if not words:
            out[flag] = True
            return
        text = " ".join(words)
        try:
            out[flag] = read_yaml(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"command line: --{flag}: malformed YAML value {text!r}: {_problem(e)}") from None

    for word in argv:
        if re.match(r"^--[A-Za-z_]", word):
            close()
            flag, words = word[2:].rstrip(":"), []
        elif flag is None:
            raise ConfigError(f"command line: {word!r}: value without a --flag in front of it")
        else:
            words.append(word)
    close()
    return out


def config_layout(root: str) -> Optional[str]:
    """``"folders"`` (``config_general/default.yaml`` ...), ``"flat"`` (``config_general.yaml`` ...) or None."""
    if any(os.path.isdir(os.path.join(root, f)) for f in CONFIG_FOLDERS):
        return "folders"
    if any(os.path.isfile(os.path.join(root, f + ".yaml")) for f in CONFIG_FOLDERS):
        return "flat"
    return None


def shipped_configs() -> List[str]:
    """Names of the configs shipped in ``pml_extensions/configs`` (both layouts)."""
    return sorted(n for n in os.listdir(SHIPPED) if config_layout(os.path.join(SHIPPED, n)))


def find_config(name_or_path: str) -> str:
    """The one config locator: a folder path, or the name of a config shipped in ``pml_extensions/configs``.

    Raises:
        ConfigError: naming what was looked for and the shipped names (never an absolute install path).
    """
    name_or_path = str(name_or_path)
    if os.path.isdir(name_or_path) and config_layout(name_or_path):
        return name_or_path
    shipped = os.path.join(SHIPPED, name_or_path)
    if os.sep not in name_or_path and os.path.isdir(shipped):
        return shipped
    if os.path.isdir(name_or_path):
        raise ConfigError(f"{name_or_path}: no config_<category>/ folders or config_<category>.yaml files in it")
    raise ConfigError(f"{name_or_path}: missing config folder (shipped configs: {', '.join(shipped_configs())})")


def display_path(path: str) -> str:
    """``path`` for messages: relative to the shipped configs (``configs/x/...``), relative to the working folder
    when inside it, else absolute (the same message wherever the command was started)."""
    path = os.path.abspath(path)
    root = os.path.dirname(SHIPPED)
    if path.startswith(root + os.sep):
        return os.path.relpath(path, root)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def _file_list(config_root: str, selection: Dict[str, Sequence[str]]) -> List[Tuple[str, str]]:
    """(category, path) in merge order for either layout."""
    files = []
    if config_layout(config_root) == "flat":
        if selection:
            raise ConfigError(
                f"command line: --{next(iter(selection))}: {display_path(config_root)} keeps one file per category "
                "(config_<category>.yaml); choose variants with its `variants` key instead"
            )
        unknown = sorted(
            f
            for f in os.listdir(config_root)
            if f.startswith("config_") and f.endswith(".yaml") and f[:-5] not in CONFIG_FOLDERS
        )
        if unknown:
            raise ConfigError(
                f"{display_path(os.path.join(config_root, unknown[0]))}: unknown config category; "
                f"choose from {', '.join(CONFIG_FOLDERS)}"
            )
        for folder in CONFIG_FOLDERS:
            path = os.path.join(config_root, folder + ".yaml")
            if os.path.isfile(path):
                files.append((folder, path))
        return files
    for folder in CONFIG_FOLDERS:
        names = selection.get(folder)
        folder_path = os.path.join(config_root, folder)
        if names is None:
            if not os.path.isdir(folder_path):
                continue
            names = ["default"]
        for name in [names] if isinstance(names, str) else names:
            path = os.path.join(folder_path, f"{name}.yaml")
            if not os.path.isfile(path):
                raise ConfigError(f"{display_path(path)}: missing config file (selected by {folder}: {list(names)})")
            files.append((folder, path))
    return files


def merge_config(
    config_root: str,
    selection: Optional[Dict[str, Sequence[str]]] = None,
    overrides: Optional[Dict[str, Any]] = None,
) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Merge a config's files (either form), then the command-line overrides.

    Args:
        config_root: a config folder (see :func:`find_config`).
        selection: folder -> list of file names without ``.yaml`` (default ``["default"]`` for every folder
            that exists under ``config_root``), merged in order; folders form only.
        overrides: parsed command-line dict (markers allowed), merged last.

    Returns:
        ``(config, sources)``: the merged dict and a :class:`pml_extensions.runner.config.sources.Sources` (the file
        or ``"command line"`` that set each value; ``sources.file_keys``: the keys the files set).

    Raises:
        ConfigError: missing root/folder/file, malformed YAML, bad markers, unknown folder in ``selection``.

    Example::

        >>> cfg, src = merge_config(find_config("contrastive"), {"config_general": ["default", "quick"]})
        >>> cfg["num_epochs_train"], src["num_epochs_train"]
        (3, 'configs/contrastive/config_general/quick.yaml')
    """
    if not os.path.isdir(config_root):
        raise ConfigError(f"{display_path(config_root)}: missing config folder")
    selection = dict(selection or {})
    for folder in selection:
        if folder not in CONFIG_FOLDERS:
            raise ConfigError(
                f"command line: --{folder}: unknown config folder; choose from {', '.join(CONFIG_FOLDERS)}"
            )
    config: Dict[str, Any] = {}
    sources = Sources()
    variants: Dict[str, Any] = {}
    # each folder's files merge among themselves first, then over the folders before it
    for folder, files in itertools.groupby(_file_list(config_root, selection), key=lambda file: file[0]):
        folder_config: Dict[str, Any] = {}
        for _, path in files:
            shown = display_path(path)
            data = load_yaml(path)
            if "variants" in data:  # kept raw: their markers act on the merged config (variant_configs)
                if not isinstance(data["variants"] or {}, dict):
                    raise ConfigError(f"{shown}: variants: expected a mapping name -> changes")
                variants.update(data.pop("variants") or {})
                sources["variants"] = shown
            folder_config = merge(folder_config, data, shown)
            for k in data:
                sources[split_marker(k, shown)[0]] = shown
            merged = merge(config, folder_config, display_path(os.path.join(config_root, folder)))
            sources.add_layer(shown, merged, data)  # the config after this file: Sources.of names a nested value's
        config = merged
    if variants:
        config["variants"] = variants
    file_keys = set(config)
    if overrides:
        given = list(overrides)
        overrides, config = _variants_from_command_line(overrides, config)
        config = merge(config, overrides, "command line")
        for k in given:
            sources[split_marker(k, "command line")[0]] = "command line"
        sources.add_layer("command line", config, overrides)
    sources.file_keys = file_keys
    return config, sources


def _variants_from_command_line(overrides: Dict[str, Any], config: Dict[str, Any]):
    """``--variants`` given as changes, kept raw as the files' ``variants`` are: ``~OVERRIDE~`` replaces them all, a
    plain mapping replaces or adds entries, ``~DELETE~`` removes them; ``~APPLY~`` / ``~SWAP~`` are refused."""
    rest, config = {}, dict(config)
    for key, value in overrides.items():
        name, op, _ = split_marker(key, "command line")
        if name != "variants" or (op is None and not isinstance(value, dict)):
            rest[key] = value  # (--variants a b, names to keep, is the CLI's selection)
        elif op == "DELETE":
            config.pop("variants", None)
        elif op not in (None, "OVERRIDE") or not isinstance(value, dict):
            raise ConfigError(
                f"command line: --{key}: a variant's entry is a set of changes with markers of its own; give the "
                "entries whole: --variants '{name: {...}}' replaces or adds them, --variants~OVERRIDE~ '{...}' "
                "replaces them all"
            )
        else:
            kept = {} if op == "OVERRIDE" else dict(config.get("variants") or {})
            config["variants"] = {**kept, **copy.deepcopy(value)}
    return rest, config


def variant_configs(
    config: Dict[str, Any], names: Optional[Sequence[str]] = None, where: str = "config_general"
) -> Dict[str, Dict[str, Any]]:
    """The flat form's ``variants``: ``{name: update}``, each merged (with :func:`merge`, markers allowed) over the
    rest of the config. A config without ``variants`` is one variant called ``default``.

    Args:
        config: a merged config from :func:`load_config`.
        names: only these variants, in this order (default all).
        where: the file named in error messages.

    Returns:
        variant name -> full config (without ``variants``).

    Raises:
        ConfigError: ``variants`` not a mapping, or an unknown name (the message lists the existing ones).

    Example::

        >>> variant_configs({"seed": 0, "variants": {"a": {}, "b": {"seed": 1}}})
        {'a': {'seed': 0}, 'b': {'seed': 1}}
    """
    base = {k: v for k, v in config.items() if k != "variants"}
    variants = config.get("variants") or {"default": {}}
    if not isinstance(variants, dict):
        raise ConfigError(f"{where}: variants: expected a mapping name -> changes, got {type(variants).__name__}")
    if names:
        unknown = [n for n in names if n not in variants]
        if unknown:
            raise ConfigError(
                f"{where}: variants: unknown {', '.join(map(repr, unknown))}; this config has {', '.join(variants)}"
            )
        variants = {n: variants[n] for n in names}
    return {name: merge(base, update or {}, f"{where}: variants.{name}") for name, update in variants.items()}


def select_variants(config: Dict[str, Any], names: Sequence[str]) -> Dict[str, Any]:
    """Keep only the flat form's ``variants`` called ``names`` (in the config's order) and the ``comparisons``
    between them (``--variants a b`` on the command line).

    Raises:
        ConfigError: a config without ``variants``, or a name it does not have (the message lists them).

    Example::

        >>> cfg = {"variants": {"a": {}, "b": {}, "c": {}}, "comparisons": [["a", "b"], ["a", "c"]]}
        >>> select_variants(cfg, ["c", "a"])
        {'variants': {'a': {}, 'c': {}}, 'comparisons': [['a', 'c']]}
        >>> select_variants(dict(cfg, untrained=True, comparisons=[["a", "untrained"]]), ["a"])["comparisons"]
        [['a', 'untrained']]
    """
    variants = config.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ConfigError("command line: --variants: this config has no variants to choose from")
    unknown = sorted(set(names) - set(variants))
    if unknown:
        raise ConfigError(f"command line: --variants: unknown {unknown}; config has {sorted(variants)}")
    out = dict(config)
    out["variants"] = {k: v for k, v in variants.items() if k in names}
    if "comparisons" in config:
        kept = set(names) | ({"untrained"} if config.get("untrained") else set())  # the untrained row stays a row
        out["comparisons"] = [p for p in config.get("comparisons") or [] if all(v in kept for v in p)]
    return out


def split_selection(cli: Dict[str, Any]) -> Tuple[Dict[str, List[str]], Dict[str, Any]]:
    """Separate ``config_<folder>`` selections from the other command-line keys.

    Raises:
        ConfigError: if a selection is not a name or a list of names.
    """
    selection, rest = {}, {}
    for k, v in cli.items():
        if isinstance(k, str) and k.startswith("config_") and k != "config_root":
            if isinstance(v, str):
                v = [v]
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigError(
                    f"command line: --{k}: expected a file name or a list like [default, other], got {v!r}"
                )
            selection[k] = v
        else:
            rest[k] = v
    return selection, rest
