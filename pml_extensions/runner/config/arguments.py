"""Every class name and keyword argument of a config's ``{ClassName: {kwargs}}`` specs, checked at load time against
the class index (no torch import), and :data:`ARGUMENT_RULES`; every problem of one pass is reported together.

Example::

    >>> config = {"loss_funcs": {"metric_loss": {"XMLWrapper": {"loss": {"ContrastivLoss": {}}}}}}
    >>> try:
    ...     check_arguments(config, {"loss_funcs": "command line"})
    ... except ValueError as e:
    ...     print(e)
    command line: loss_funcs.metric_loss.XMLWrapper.loss: unknown class 'ContrastivLoss'; did you mean ContrastiveLoss?
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...utils.checks import is_int, is_number
from ..errors import ConfigError, ConfigProblems
from .loader import find_search_markers, key_path, merged_next_to, source_of, variant_configs
from .pb_keys import NAMED_SPEC_KEYS, ONE_SPEC_KEYS, tester_spec
from .registry import _nearest_name, all_names, lookup, resolve
from .specs import is_object_spec, nearest

#: keys the runner reads itself out of a spec's arguments (path prefix -> names)
RUNNER_ARGUMENTS = {"optimizers": ("prototype_lr", "param_groups"), "tester": ("reference_set",)}


#: (key prefix, argument) -> (lowest value, integer?, what it is); the prefix is the top-level key ("" for any)
ARGUMENT_RULES: Dict[Tuple[str, str], Tuple[float, bool, str]] = {
    ("", "batch_size"): (1, True, "images per batch"),
    ("", "iterations_per_epoch"): (1, True, "batches per epoch"),
    ("", "dataloader_num_workers"): (0, True, "data loading processes; 0 loads in the main process"),
    ("", "length_before_new_iter"): (1, True, "indices per pass over the data"),
    ("sampler", "m"): (1, True, "images per class in a batch"),
    ("optimizers", "lr"): (0, False, "the learning rate"),
    ("optimizers", "prototype_lr"): (0, False, "the prototypes' learning rate"),
}


class _Checker:
    def __init__(self, sources, suffix: str = "", known: Sequence[str] = ()):
        self.sources, self.suffix = sources, suffix
        self.found: List[str] = []
        self.known = set(known)  # a variant's check leaves out the problems of the config it is merged over

    def fail(self, path: Tuple, message: str, source_path: Optional[Tuple] = None) -> None:
        self.record(f"{source_of(self.sources, source_path or path)}: {key_path(path)}: {message}")

    def record(self, line: str) -> None:
        if line not in self.known and line + self.suffix not in self.found:
            self.found.append(line + self.suffix)

    def unknown(self, name: str, here: Tuple) -> bool:
        """Record ``unknown class 'X'; did you mean Y?`` when :func:`resolve` (which imports) cannot find ``name``."""
        try:
            resolve(name)
        except ConfigError:
            self.fail(here[:-1], f"unknown class {name!r}{_nearest_name(name, all_names())}", here)
            return True
        return False

    def spec(self, spec: Any, path: Tuple) -> None:
        """Check one spec (a lower-case name is a function), or a list of them."""
        if isinstance(spec, list):
            for i, item in enumerate(spec):
                self.spec(item, path + (i,))
            return
        if isinstance(spec, dict) and len(spec) > 1:
            classes = [k for k in spec if isinstance(k, str) and k[:1].isupper()]
            others = [str(k) for k in spec if k not in classes]
            if classes and others:  # e.g. ~APPLY~2 where ~APPLY~3 reaches the arguments
                self.fail(
                    path,
                    f"expected one {{ClassName: {{kwargs}}}}, got {', '.join(others)} next to {', '.join(classes)}: "
                    f"arguments belong one level deeper, inside {classes[0]} (~APPLY~ counts the levels)",
                )
        if not (isinstance(spec, dict) and len(spec) == 1 and isinstance(next(iter(spec)), str)):
            return
        name, args = next(iter(spec.items()))
        if "~" in name:
            return  # a search marker (~BAYESIAN~) inside: the search checks it
        entry = lookup(name)
        here = path + (name,)
        if entry is None:
            if self.unknown(name, here):
                self.value(args, here)  # the names inside it too, in the same pass
            return
        if isinstance(args, list):
            check = self.spec if name == "Sequential" else self.value
            for i, item in enumerate(args):
                check(item, here + (i,))
            return
        if not isinstance(args, dict):
            return
        extra = RUNNER_ARGUMENTS.get(path[0], ()) if path else ()
        for key, value in args.items():
            if not isinstance(key, str) or "~" in key:
                continue
            if not entry["open"] and key not in entry["params"] and key not in extra:
                close = nearest(key, entry["params"])
                self.fail(here, f"bad arguments: {name} takes no argument {key!r}{close}", here + (key,))
            if key == "param_groups" and key in extra and isinstance(value, list):  # {modules: ClassName, ...}
                for i, group in enumerate(value):
                    modules = group.get("modules") if isinstance(group, dict) else None
                    if isinstance(modules, str) and lookup(modules) is None:
                        self.unknown(modules, here + (key, i, "modules"))
            for (prefix, argument), (low, integer, what) in ARGUMENT_RULES.items():
                if argument != key or (prefix and not (path and path[0] == prefix)):
                    continue
                if integer and (not is_int(value) or value < low):
                    kind = "positive" if low == 1 else "non-negative"
                    self.fail(path, f"{key} must be a {kind} integer, got {value!r} ({what})", here + (key,))
                elif not integer and (not is_number(value) or not value >= low):
                    self.fail(path, f"{key} must be a number >= {low:g}, got {value!r} ({what})", here + (key,))
            self.value(value, here + (key,))

    def value(self, value: Any, path: Tuple) -> None:
        """An argument's value: a nested spec (or a function the index knows), or a list or mapping of them."""
        first = next(iter(value)) if isinstance(value, dict) and len(value) == 1 else None
        entry = lookup(first) if isinstance(first, str) and first[:1].islower() else None
        if isinstance(value, list):
            for i, item in enumerate(value):
                self.value(item, path + (i,))
        elif is_object_spec(value) or (entry is not None and entry["kind"] == "function"):
            self.spec(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and "~" not in key:
                    self.value(item, path + (key,))

    def named_dataset(self, spec: Any) -> None:
        """Refuse a dataset's new ``name`` merged next to an earlier file's ``kwargs`` or ``root``."""
        if not (isinstance(spec, dict) and isinstance(spec.get("name"), str)) or is_object_spec(spec):
            return
        new = source_of(self.sources, ("dataset", "name"))
        if new != source_of(self.sources, "dataset"):
            return  # the name is not what changed last: arguments refined on top of it
        kwargs = spec.get("kwargs") if isinstance(spec.get("kwargs"), dict) else {}
        stale = {("kwargs", k): source_of(self.sources, ("dataset", "kwargs", k)) for k in kwargs}
        if spec.get("root") is not None:
            stale[("root",)] = source_of(self.sources, ("dataset", "root"))
        stale = {path: source for path, source in stale.items() if source != new}
        if not stale:
            return
        layers = [config.get("dataset") for _, config, _ in getattr(self.sources, "layers", [])]
        names = [d["name"] for d in layers if isinstance(d, dict) and isinstance(d.get("name"), str)]
        names = [n for n in names if n != spec["name"]]
        old = f" {names[-1]}" if names else ""
        keys = ", ".join(".".join(path) for path in stale)
        folder = (
            "; --data_folder PATH makes your folder or CSV file the dataset"
            if new == "command line" and spec["name"] in ("csv", "imagefolder")
            else ""
        )
        self.fail(
            ("dataset",),
            merged_next_to(f"name {spec['name']}", new, f"{keys} of the dataset{old}", stale.values(), "dataset")
            + folder,
            ("dataset", "name"),
        )

    def config(self, config: Dict[str, Any]) -> None:
        self.named_dataset(config.get("dataset"))
        for key in NAMED_SPEC_KEYS:
            value = config.get(key)
            if isinstance(value, dict):
                for name, spec in value.items():
                    self.spec(spec, (key, name))
        for key in ONE_SPEC_KEYS:
            value = config.get(key)
            if key == "tester" and value is not None and not find_search_markers({"tester": value}):
                try:  # the builder's own check first; when it refuses, the generic one would name the same problem
                    tester_spec(config, self.sources)
                except ConfigError as e:
                    self.record(str(e).splitlines()[0])
                    continue
            if is_object_spec(value) or (key != "dataset" and isinstance(value, dict) and len(value) == 1):
                self.spec(value, (key,))
        transforms = config.get("transforms")
        if isinstance(transforms, dict):
            for which, chain in transforms.items():
                if isinstance(chain, dict) and not is_object_spec(chain):  # PB's mapping of transforms
                    for name, kwargs in chain.items():
                        self.spec({name: kwargs}, ("transforms", which))
                else:
                    self.spec(chain, ("transforms", which))


def check_arguments(config: Dict[str, Any], sources: Optional[Dict[str, str]] = None) -> None:
    """Check the config and each of its variants; ConfigError (ConfigProblems for several), one line per problem."""
    checker = _Checker(sources)
    checker.config(config)
    found = list(checker.found)
    variants = config.get("variants")
    if isinstance(variants, dict) and variants:
        for name, variant in variant_configs(config, where=(sources or {}).get("variants", "config")).items():
            checker = _Checker(sources, f" (variant {name})", known=found)
            checker.config(variant)
            found += checker.found
    if found:
        raise ConfigProblems(found)
