"""Read config folders in powerful-benchmarker's "Metric Learning Reality Check" (MLRC) layout.

A config root holds one folder per category (:data:`CONFIG_FOLDERS`); each folder holds YAML files. A run
selects, per folder, a list of file names (default ``[default]``) that are merged in the given order, and then
the command line is merged on top. The syntax follows powerful-benchmarker's documentation
(``docs/cl_syntax.md`` and ``docs/yaml_syntax.md`` of ``KevinMusgrave/powerful-benchmarker``); the code is
ours.

Merging and its key markers (usable in YAML files and on the command line):

* plain keys merge recursively: ``{trunk_optimizer: {RMSprop: {lr: 0.01}}}`` changes ``lr`` and keeps the
  rest;
* ``key~OVERRIDE~: value`` replaces ``key`` instead of merging into it;
* ``key~APPLY~n: {..}`` merges the dict into every dict found at depth ``n`` below ``key`` (``key``'s own
  value is depth 1): ``trainer~APPLY~2: {batch_size: 256}`` sets the batch size of whatever trainer is
  configured;
* ``key~SWAP~n: {old: new}`` renames keys at depth ``n`` (order kept); ``{New: null}`` renames the only key
  there: ``trainer~SWAP~1: {TrainWithClassifier: null}`` keeps the trainer's arguments and changes its class;
* ``key~DELETE~: anything`` removes ``key``;
* ``key~BAYESIAN~`` / ``~LOG_BAYESIAN~`` / ``~INT_BAYESIAN~: [low, high]`` mark a hyper-parameter search. Not
  supported here: :func:`load_config` refuses them with a one-line :class:`ConfigError` (see
  ``check_no_search``).

Command line (``parse_command_line``): ``--name value`` pairs, the value parsed as YAML, so a value may span
several shell words: ``--optimizers~APPLY~3 {lr: 0.01}``, ``--config_general [default, with_quick]``. A
flag with no value is ``True``. ``--config_<folder> [names]`` select files; every other flag is merged into
the config.

Every error is a :class:`pml_extensions.runner.factory.ConfigError` whose one-line message starts with the
file (or ``command line``) and names the key.
"""

import copy
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from .factory import ConfigError

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

_MARKER = re.compile(
    r"^(?P<name>.*?)~(?P<op>OVERRIDE|DELETE|APPLY|SWAP|BAYESIAN|LOG_BAYESIAN|INT_BAYESIAN)~(?P<n>\d*)$"
)
_SEARCH_OPS = ("BAYESIAN", "LOG_BAYESIAN", "INT_BAYESIAN")


def split_marker(key: Any, where: str = "config") -> Tuple[Any, Optional[str], Optional[int]]:
    """Split ``"name~OP~n"`` into ``(name, OP, n)``; plain keys give ``(key, None, None)``.

    Raises:
        ConfigError: if ``~APPLY~``/``~SWAP~`` lack a positive depth or other markers carry one.
    """
    if not isinstance(key, str):
        return key, None, None
    match = _MARKER.match(key)
    if match is None:
        return key, None, None
    name, op, n = match.group("name"), match.group("op"), match.group("n")
    if op in ("APPLY", "SWAP"):
        if not n or int(n) < 1:
            raise ConfigError(f"{where}: key {key!r}: ~{op}~ needs a depth >= 1, e.g. {name}~{op}~1")
        return name, op, int(n)
    if n:
        raise ConfigError(f"{where}: key {key!r}: ~{op}~ takes no depth number")
    return name, op, None


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _clean(value: Any, where: str) -> Any:
    """Resolve markers inside a value that is inserted as a whole (merge into an empty dict)."""
    if isinstance(value, dict):
        return merge({}, value, where)
    return copy.deepcopy(value)


def merge(base: Dict, update: Dict, where: str = "") -> Dict:
    """Return ``base`` with ``update`` merged in (neither input is modified).

    Args:
        base: the config so far (plain keys only).
        update: a dict that may use the key markers described in the module docstring.
        where: prefix of error messages: the file name, then the key path.

    Raises:
        ConfigError: on ``~APPLY~``/``~SWAP~`` whose target is missing or not a dict, a ``~SWAP~`` mapping
        that names a missing key or is ambiguous, or a non-dict ``update``.
    """
    if not isinstance(update, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(update).__name__}")
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in update.items():
        name, op, depth = split_marker(key, where or "config")
        here = _join(where, key)
        if op == "DELETE":
            out.pop(name, None)
        elif op == "OVERRIDE":
            out[name] = _clean(value, here)
        elif op in ("APPLY", "SWAP"):
            if not isinstance(value, dict):
                raise ConfigError(f"{here}: ~{op}~ needs a mapping value, got {type(value).__name__}")
            if name not in out or not isinstance(out[name], dict):
                raise ConfigError(f"{here}: ~{op}~ target {name!r} does not exist or is not a mapping")
            if op == "APPLY":
                out[name] = _apply(out[name], _clean(value, here), depth, here)
            else:
                out[name] = _swap(out[name], value, depth, here)
        elif op in _SEARCH_OPS:
            out[key] = copy.deepcopy(value)  # kept with its marker; refused later by check_no_search
        elif name in out and isinstance(out[name], dict) and isinstance(value, dict):
            out[name] = merge(out[name], value, here)
        else:
            out[name] = _clean(value, here)
    return out


def _apply(target: Dict, value: Dict, depth: int, where: str) -> Dict:
    if depth == 1:
        return merge(target, value, where)
    out = {}
    for k, v in target.items():
        if isinstance(v, dict):
            out[k] = _apply(v, value, depth - 1, _join(where, k))
        elif v is None and depth == 2:
            out[k] = copy.deepcopy(value)  # e.g. ``ContrastiveLoss: null`` receives the applied kwargs
        else:
            out[k] = v
    return out


def _swap(target: Dict, mapping: Dict, depth: int, where: str) -> Dict:
    if depth > 1:
        return {
            k: (_swap(v, mapping, depth - 1, _join(where, k)) if isinstance(v, dict) else v)
            for k, v in target.items()
        }
    renames = {}
    for old, new in mapping.items():
        if new is None or new == {}:
            if len(target) != 1:
                raise ConfigError(
                    f"{where}: ~SWAP~ to {old!r} needs exactly one key at that depth, found {list(target)}; "
                    f"use {{old_name: {old}}}"
                )
            renames[next(iter(target))] = old
        elif old in target:
            renames[old] = new
    return {renames.get(k, k): v for k, v in target.items()}


def find_search_markers(config: Any, where: str = "") -> List[str]:
    """Key paths that carry a ``~BAYESIAN~``-family marker."""
    found = []
    if isinstance(config, dict):
        for k, v in config.items():
            _, op, _ = split_marker(k)
            if op in _SEARCH_OPS:
                found.append(_join(where, k))
            found.extend(find_search_markers(v, _join(where, k)))
    elif isinstance(config, list):
        for i, v in enumerate(config):
            found.extend(find_search_markers(v, f"{where}[{i}]"))
    return found


def check_no_search(config: Dict, sources: Optional[Dict[str, str]] = None) -> None:
    """Refuse hyper-parameter search markers with one line.

    Raises:
        ConfigError: naming the file and key of the first marker found.
    """
    found = find_search_markers(config)
    if not found:
        return
    top = found[0].split(".")[0]
    source = (sources or {}).get(top, "config")
    try:
        import optuna  # noqa: F401

        reason = "hyper-parameter search is not implemented by this runner yet"
    except ImportError:
        reason = "hyper-parameter search needs optuna, which is not installed (pip install optuna)"
    raise ConfigError(f"{source}: key {found[0]}: {reason}; replace the marker by a fixed value")


def _key_before_line(text: str, line: int) -> str:
    """The nearest key at or above ``line`` (0-based) in YAML text, for error messages."""
    lines = text.splitlines()
    for i in range(min(line, len(lines) - 1), -1, -1):
        m = re.match(r"^\s*([^\s#:\-][^:#]*?)\s*:(\s|$)", lines[i])
        if m:
            return m.group(1)
    return "<top>"


def load_yaml_file(path: str) -> Dict:
    """Load one YAML file as a dict (empty file -> ``{}``).

    Raises:
        ConfigError: ``"<path>: missing config file"``, ``"<path>:<line>: key <k>: malformed YAML: ..."`` or
            ``"<path>: top level must be a mapping"``.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: missing config file")
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line if mark is not None else 0
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path}:{line + 1}: key {_key_before_line(text, line)!r}: malformed YAML: {problem}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: key <top>: top level must be a mapping, got {type(data).__name__}")
    return data


def parse_command_line(argv: Sequence[str]) -> Dict[str, Any]:
    """Parse ``--name value ...`` into a dict; values are YAML (``{a: 1}``, ``[x, y]``, ``0.1``, ``null``).

    Raises:
        ConfigError: ``"command line: --name: ..."`` for values without a flag or malformed YAML values.
    """
    out: Dict[str, Any] = {}
    flag, words = None, []

    def close():
        if flag is None:
            return
        if not words:
            out[flag] = True
            return
        text = " ".join(words)
        try:
            out[flag] = yaml.safe_load(text)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"command line: --{flag}: malformed YAML value {text!r}: {problem}") from None

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


def load_config(
    config_root: str,
    selection: Optional[Dict[str, Sequence[str]]] = None,
    overrides: Optional[Dict[str, Any]] = None,
    allow_search: bool = False,
) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Merge a config root's files and the command-line overrides.

    Args:
        config_root: folder that holds the ``config_*`` folders.
        selection: folder -> list of file names without ``.yaml`` (default ``["default"]`` for every folder
        that exists under ``config_root``), merged in order.
        overrides: parsed command-line dict (markers allowed), merged last.
        allow_search: keep ``~BAYESIAN~`` markers instead of refusing them.

    Returns:
        ``(config, sources)``: the merged dict and, per top-level key, the file (or ``"command line"``) that
        set it last — used to name the file in later error messages.

    Raises:
        ConfigError: missing root/folder/file, malformed YAML, bad markers, unknown folder in ``selection``.
    """
    if not os.path.isdir(config_root):
        raise ConfigError(f"{config_root}: missing config folder")
    selection = dict(selection or {})
    for folder in selection:
        if folder not in CONFIG_FOLDERS:
            raise ConfigError(
                f"command line: --{folder}: unknown config folder; choose from {', '.join(CONFIG_FOLDERS)}"
            )
    config: Dict[str, Any] = {}
    sources: Dict[str, str] = {}
    for folder in CONFIG_FOLDERS:
        names = selection.get(folder)
        folder_path = os.path.join(config_root, folder)
        if names is None:
            if not os.path.isdir(folder_path):
                continue
            names = ["default"]
        if isinstance(names, str):
            names = [names]
        per_folder: Dict[str, Any] = {}
        for name in names:
            path = os.path.join(folder_path, f"{name}.yaml")
            if not os.path.isfile(path):
                raise ConfigError(f"{path}: missing config file (selected by {folder}: {list(names)})")
            data = load_yaml_file(path)
            per_folder = merge(per_folder, data, path)
            for k in data:
                sources[split_marker(k, path)[0]] = path
        config = merge(config, per_folder, folder_path)
    if overrides:
        config = merge(config, overrides, "command line")
        for k in overrides:
            sources[split_marker(k, "command line")[0]] = "command line"
    if not allow_search:
        check_no_search(config, sources)
    return config, sources


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
