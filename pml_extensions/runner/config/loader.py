"""How a config's files merge: PB's folders or the flat form, then the command line, with powerful-benchmarker's key
markers (:func:`merge`: ``~OVERRIDE~``, ``~APPLY~n``, ``~SWAP~n``, ``~DELETE~``, ``~BAYESIAN~``; docs/configs.md), and
where each value of the merged config came from (:class:`Sources`). Every error is a one-line
:class:`~pml_extensions.runner.errors.ConfigError` that starts with the file (or ``command line``).

Example::

    >>> s = Sources({"trainer": "command line"})
    >>> s.add_layer("general.yaml", {"trainer": {"T": {"batch_size": 32, "iterations_per_epoch": 100}}})
    >>> s.add_layer("command line", {"trainer": {"T": {"batch_size": 64, "iterations_per_epoch": 100}}})
    >>> s.of("trainer.T.batch_size"), s.of(("trainer", "T", "iterations_per_epoch")), s.of("seed")
    ('command line', 'general.yaml', 'config')
    >>> describe("command line"), describe("configs/contrastive/config_general/quick.yaml")
    ('the command line', 'the shipped configs/contrastive/config_general/quick.yaml')
"""

import copy
import importlib.util
import itertools
import os
import re
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import yaml

from ..errors import ConfigError
from .specs import read_yaml

_MARKER = re.compile(
    r"^(?P<name>.*?)~(?P<op>OVERRIDE|DELETE|APPLY|SWAP|BAYESIAN|LOG_BAYESIAN|INT_BAYESIAN)~(?P<n>\d*)$"
)
_SEARCH_OPS = ("BAYESIAN", "LOG_BAYESIAN", "INT_BAYESIAN")


def split_marker(key: Any, where: str = "config") -> Tuple[Any, Optional[str], Optional[int]]:
    """Split ``"name~OP~n"`` into ``(name, OP, n)`` (plain keys: ``(key, None, None)``)."""
    match = _MARKER.match(key) if isinstance(key, str) else None
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


def _drop_variants(out: Dict, name: Any, keep_plain: bool = False) -> None:
    """A plain key replaces its ``~BAYESIAN~``-family twin and vice versa."""
    for key in ([] if keep_plain else [name]) + [f"{name}~{op}~" for op in _SEARCH_OPS]:
        out.pop(key, None)


def _template(old: Any, value: Any, where: str) -> Any:
    """The value of ``key~OVERRIDE~: value``: markers inside ``value`` act on the old value at the same place."""
    if not isinstance(value, dict):
        return copy.deepcopy(value)
    old = old if isinstance(old, dict) else {}
    out: Dict = {}
    for key, v in value.items():
        name, op, _ = split_marker(key, where)
        if op in ("APPLY", "SWAP"):
            out.update(merge({name: old[name]} if name in old else {}, {key: v}, where))
        elif (op is None and not isinstance(v, dict)) or op in _SEARCH_OPS:
            out[key] = copy.deepcopy(v)
        elif op != "DELETE":  # plain or nested OVERRIDE: replace, resolving markers inside against the old value
            out[name] = _template(old.get(name), v, _join(where, key))
    return out


def merge(base: Dict, update: Dict, where: str = "") -> Dict:
    """Return ``base`` with ``update`` merged in (neither input is modified); every marker works at every depth and
    inside every other marker's value.

    Args:
        base: the config so far (plain keys only).
        update: a dict that may use the key markers.
        where: prefix of error messages: the file name, then the key path.

    Raises:
        ConfigError: on ``~APPLY~``/``~SWAP~`` whose target is missing or not a dict, a ``~SWAP~`` mapping
        that names a missing key or is ambiguous, or a non-dict ``update``.

    Example::

        >>> merge({"tester": {"T": {"accuracy_calculator": {"AccuracyCalculator": {"k": 5}}}}},
        ...       {"tester~APPLY~2": {"accuracy_calculator~OVERRIDE~": {"ChunkedAccuracyCalculator": None}}})
        {'tester': {'T': {'accuracy_calculator': {'ChunkedAccuracyCalculator': None}}}}
    """
    if not isinstance(update, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(update).__name__}")
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in update.items():
        name, op, depth = split_marker(key, where or "config")
        here = _join(where, key)
        if op == "DELETE":
            _drop_variants(out, name)
        elif op == "OVERRIDE":
            old = out.get(name)
            _drop_variants(out, name, keep_plain=True)
            out[name] = _template(old, value, here)
        elif op in ("APPLY", "SWAP"):
            if not isinstance(value, dict):
                raise ConfigError(f"{here}: ~{op}~ needs a mapping value, got {type(value).__name__}")
            if name not in out or not isinstance(out[name], dict):
                raise ConfigError(f"{here}: ~{op}~ target {name!r} does not exist or is not a mapping")
            out[name] = (_apply if op == "APPLY" else _swap)(out[name], value, depth, here)
        elif op in _SEARCH_OPS:
            _drop_variants(out, name)
            out[key] = copy.deepcopy(value)  # kept with its marker for the search (runner.protocols.search)
        elif name in out and isinstance(out[name], dict) and isinstance(value, dict):
            out[name] = merge(out[name], value, here)
        else:
            _drop_variants(out, name, keep_plain=True)
            out[name] = merge({}, value, here) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def _apply(target: Dict, value: Dict, depth: int, where: str) -> Dict:
    """Merge ``value`` into every dict at ``depth`` (``target`` is depth 1); a non-dict there is replaced, as in PB."""
    if depth == 1:
        return merge(target, value, where)  # a non-dict target merges as {}
    return {
        k: _apply(v, value, depth - 1, _join(where, k)) if isinstance(v, dict) or depth == 2 else v
        for k, v in target.items()
    }


def _swap(target: Dict, mapping: Dict, depth: int, where: str) -> Dict:
    if depth > 1:
        return {
            k: (_swap(v, mapping, depth - 1, _join(where, k)) if isinstance(v, dict) else v) for k, v in target.items()
        }
    renames = {}
    for old, new in mapping.items():
        if new is None or new == {}:
            if old in target:
                continue  # already that class
            if len(target) != 1:
                raise ConfigError(
                    f"{where}: ~SWAP~ to {old!r} needs exactly one key at that depth, found {list(target)}; "
                    f"use {{old_name: {old}}}"
                )
            renames[next(iter(target))] = old
        elif old in target:
            renames[old] = new
        else:
            raise ConfigError(f"{where}: ~SWAP~ {old!r} -> {new!r}: no key {old!r} here (keys: {list(target)})")
    return {renames.get(k, k): v for k, v in target.items()}


def key_path(path: Sequence[Any]) -> str:
    """``("trunk", 0, "ConvNetBody")`` -> ``"trunk[0].ConvNetBody"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def search_markers(config: Any, path: Tuple = ()) -> Iterator[Tuple[Tuple, str, Any]]:
    """``(path, op, value)`` of every ``~BAYESIAN~``-family key of ``config``, at any depth, list items included."""
    if isinstance(config, dict):
        for key, value in config.items():
            op = split_marker(key)[1]
            if op in _SEARCH_OPS:
                yield path + (key,), op, value
            else:
                yield from search_markers(value, path + (key,))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            yield from search_markers(value, path + (i,))


def find_search_markers(config: Any) -> List[str]:
    """Key paths that carry a ``~BAYESIAN~``-family marker."""
    return [key_path(path) for path, _, _ in search_markers(config)]


_MISSING = object()


def _value(config: Any, path: Sequence[Any]) -> Any:
    for key in path:
        if isinstance(config, dict) and key in config:
            config = config[key]
        elif isinstance(config, list) and isinstance(key, int) and -len(config) <= key < len(config):
            config = config[key]
        else:
            return _MISSING
    return config


class Sources(dict):
    """top-level key -> the file (or ``"command line"``) that set it last; :meth:`of` names a nested value's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: (name, config after it, the paths it replaced whole with ``~OVERRIDE~``: every value below one is its own)
        self.layers: List[Tuple[str, Dict[str, Any], List[Tuple[Any, ...]]]] = []

    def add_layer(self, name: str, config: Dict[str, Any], update: Optional[Dict[str, Any]] = None) -> None:
        """Record the config after ``name``; ``update``'s ``~OVERRIDE~`` subtrees are all its own."""
        self.layers.append((name, copy.deepcopy(config), _overridden(update or {})))

    def of(self, path: Union[str, Sequence[Any]]) -> str:
        """The source that last changed the value at ``path`` (dotted or a sequence of keys), else its top key's."""
        keys = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
        found, previous = None, _MISSING
        for name, config, overridden in self.layers:
            value = _value(config, keys)
            replaced = any(keys[: len(p)] == p for p in overridden)
            if value is not _MISSING and (previous is _MISSING or value != previous or replaced):
                found = name
            elif value is _MISSING and previous is not _MISSING:
                found = None  # deleted (~DELETE~ / ~OVERRIDE~): a later layer may set it again
            previous = value
        return found or self.get(keys[0] if keys else "", "config")


def _overridden(update: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """The paths of ``update`` marked ``~OVERRIDE~``, at any depth."""
    out: List[Tuple[Any, ...]] = []
    if isinstance(update, dict):
        for key, value in update.items():
            name, op, _ = split_marker(key)
            out += [prefix + (name,)] if op == "OVERRIDE" else _overridden(value, prefix + (name,))
    return out


def source_of(sources: Optional[Dict[str, str]], path: Union[str, Sequence[Any]]) -> str:
    """:meth:`Sources.of`, also for a plain dict (top-level keys only) or None."""
    return (sources if isinstance(sources, Sources) else Sources(sources or {})).of(path)


#: the shipped configs (``pml_extensions/configs``), whose files messages show as ``configs/<name>/...``
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def describe(source: str) -> str:
    """``"the command line"``, ``"the shipped configs/x/..."`` or ``"your <file>"``: whom a message asks to edit."""
    if source == "command line":
        return "the command line"
    if source == "config" or not source:
        return "the config"
    path = source if os.path.isabs(source) else os.path.join(os.path.dirname(SHIPPED), source)
    shipped = os.path.abspath(path).startswith(SHIPPED + os.sep) and os.path.exists(path)
    return f"the shipped {source}" if shipped else f"your {source}"


def merged_next_to(new: str, new_source: str, old: str, old_sources: Iterable[str], key: str) -> str:
    """The refusal of a plain merge that kept two objects where one belongs."""
    flag = f"--{key}~OVERRIDE~" if new_source == "command line" else f"{key}~OVERRIDE~:"
    return (
        f"{new} ({describe(new_source)}) was merged next to {old} "
        f"({', '.join(describe(s) for s in sorted(set(old_sources)))}); a merge keeps both, write {flag} to replace it"
    )


CONFIG_FOLDERS = tuple(
    f"config_{c}" for c in "general models loss_and_miners optimizers transforms eval factories dataset".split()
)


def check_no_search(config: Dict, sources: Optional[Dict[str, str]] = None) -> None:
    """Refuse hyper-parameter search markers with one line naming the file and key of the first one."""
    found = find_search_markers(config)
    if not found:
        return
    source = (sources or {}).get(found[0].split(".")[0], "config")
    if importlib.util.find_spec("optuna") is not None:  # found without importing it
        reason = "search markers run an Optuna study only through `python -m pml_extensions run` (runner's search)"
    else:
        reason = "hyper-parameter search needs optuna, which is not installed (pip install optuna)"
    raise ConfigError(f"{source}: key {found[0]}: {reason}; replace the marker by a fixed value")


def _problem(error: yaml.YAMLError) -> str:
    return getattr(error, "problem", None) or str(error).splitlines()[0]


def load_yaml(path: str) -> Dict:
    """One YAML file as a dict (empty file -> ``{}``); ConfigError naming the file (and line) when missing or bad."""
    if not os.path.isfile(path):
        raise ConfigError(f"{display_path(path)}: missing config file")
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        data = read_yaml(text)
    except yaml.YAMLError as e:
        mark, opened = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
        line, also = getattr(mark or opened, "line", 0), ""
        unclosed = (getattr(e, "context", None) or "").startswith(("while parsing a flow", "while scanning a quoted"))
        if unclosed and opened and mark and opened.line < mark.line:
            # an unclosed [ { or quote: the mistake is where it opened, PyYAML notices it on a later line
            line, also = opened.line, f" (opened on this line, still open on line {mark.line + 1})"
        keys = [re.match(r"^\s*([^\s#:\-][^:#]*?)\s*:(\s|$)", x) for x in text.splitlines()[: line + 1]]
        key = next((m.group(1) for m in reversed(keys) if m), "<top>")  # the nearest key at or above the line
        raise ConfigError(
            f"{display_path(path)}:{line + 1}: key {key!r}: malformed YAML: {_problem(e)}{also}"
        ) from None
    if not isinstance(data, (dict, type(None))):
        raise ConfigError(f"{display_path(path)}: key <top>: top level must be a mapping, got {type(data).__name__}")
    return data or {}


def parse_command_line(argv: Sequence[str]) -> Dict[str, Any]:
    """Parse ``--name value ...`` into a dict; values are YAML (``{a: 1}``, ``[x, y]``, ``1e-3``, ``null``); a bare
    ``--`` is skipped.

    Raises:
        ConfigError: ``"command line: --name: ..."`` for a value without a flag, a malformed value, or a flag given
        twice.
    """
    flags: List[Tuple[str, List[str]]] = []
    for word in argv:
        if word == "--":  # the usual end-of-options mark (`tox -e job -- ...`, typed after `job` too): no value
            continue
        if re.match(r"^--[A-Za-z_]", word):
            flags.append((word[2:].rstrip(":"), []))
        elif not flags:
            raise ConfigError(f"command line: {word!r}: value without a --flag in front of it")
        else:
            flags[-1][1].append(word)
    out: Dict[str, Any] = {}
    for flag, words in flags:
        if flag in out:
            raise ConfigError(
                f"command line: --{flag}: given twice; give it once (a mapping takes several keys: "
                '--trainer~APPLY~2 "{batch_size: 16, iterations_per_epoch: 10}")'
            )
        try:
            out[flag] = read_yaml(" ".join(words)) if words else True
        except yaml.YAMLError as e:
            raise ConfigError(
                f"command line: --{flag}: malformed YAML value {' '.join(words)!r}: {_problem(e)}"
            ) from None
    return out


def config_layout(root: str) -> Optional[str]:
    """``"folders"`` (``config_general/default.yaml`` ...), ``"flat"`` (``config_general.yaml`` ...) or None."""
    if any(os.path.isdir(os.path.join(root, f)) for f in CONFIG_FOLDERS):
        return "folders"
    if any(os.path.isfile(os.path.join(root, f + ".yaml")) for f in CONFIG_FOLDERS):
        return "flat"
    return None


def shipped_configs() -> List[str]:
    return sorted(n for n in os.listdir(SHIPPED) if config_layout(os.path.join(SHIPPED, n)))


def find_config(name_or_path: str) -> str:
    """A config folder path, or the name of a config shipped in ``pml_extensions/configs``.

    Raises:
        ConfigError: naming what was looked for and the shipped names.
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
    """``path`` for messages: ``configs/x/...`` when shipped, relative when under the working folder, else absolute."""
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
    if config_layout(config_root) == "flat":
        if selection:
            raise ConfigError(
                f"command line: --{next(iter(selection))}: {display_path(config_root)} keeps one file per category "
                "(config_<category>.yaml); choose variants with its `variants` key instead"
            )
        for f in sorted(os.listdir(config_root)):
            if f.startswith("config_") and f.endswith(".yaml") and f[:-5] not in CONFIG_FOLDERS:
                raise ConfigError(
                    f"{display_path(os.path.join(config_root, f))}: unknown config category; "
                    f"choose from {', '.join(CONFIG_FOLDERS)}"
                )
        paths = [(folder, os.path.join(config_root, folder + ".yaml")) for folder in CONFIG_FOLDERS]
        return [(folder, path) for folder, path in paths if os.path.isfile(path)]
    files = []
    for folder in CONFIG_FOLDERS:
        folder_path = os.path.join(config_root, folder)
        names = selection.get(folder, ["default"] if os.path.isdir(folder_path) else [])
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
    """``(config, sources)``: a config's files merged (``selection``: folder -> file names, default ``[default]``),
    then the command line's ``overrides``; ``sources.file_keys`` are the keys the files set.

    Example::

        >>> cfg, src = merge_config(find_config("contrastive"), {"config_general": ["default", "quick"]})
        >>> cfg["num_epochs_train"], src["num_epochs_train"]
        (3, 'configs/contrastive/config_general/quick.yaml')
    """
    if not os.path.isdir(config_root):
        raise ConfigError(f"{display_path(config_root)}: missing config folder")
    selection = dict(selection or {})
    unknown = [folder for folder in selection if folder not in CONFIG_FOLDERS]
    if unknown:
        raise ConfigError(
            f"command line: --{unknown[0]}: unknown config folder; choose from {', '.join(CONFIG_FOLDERS)}"
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
            sources.update({split_marker(k, shown)[0]: shown for k in data})
            merged = merge(config, folder_config, display_path(os.path.join(config_root, folder)))
            sources.add_layer(shown, merged, data)  # the config after this file: Sources.of names a nested value's
        config = merged
    if variants:
        config["variants"] = variants
    file_keys = set(config)
    rest = {}
    for key, value in (overrides or {}).items():  # --variants changes are kept raw, as the files' variants are
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
    if overrides:
        config = merge(config, rest, "command line")
        sources.update({split_marker(k, "command line")[0]: "command line" for k in overrides})
        sources.add_layer("command line", config, rest)
    sources.file_keys = file_keys
    return config, sources


def variant_configs(
    config: Dict[str, Any], names: Optional[Sequence[str]] = None, where: str = "config_general"
) -> Dict[str, Dict[str, Any]]:
    """Variant name (of ``names``, default all; ``default`` without ``variants``) -> its changes merged over the rest.

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
    """Keep only the ``variants`` called ``names`` and the ``comparisons`` between them (``--variants a b``).

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
    """``(config_<folder> selections, the other command-line keys)``."""
    selection, rest = {}, {}
    for k, v in cli.items():
        if isinstance(k, str) and k.startswith("config_") and k != "config_root":
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigError(
                    f"command line: --{k}: expected a file name or a list like [default, other], got {v!r}"
                )
            selection[k] = v
        else:
            rest[k] = v
    return selection, rest
