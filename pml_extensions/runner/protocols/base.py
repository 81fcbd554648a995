"""What a protocol is (docs/runner.md, "Protocols"): :class:`Protocol`, the base every protocol subclasses, and
:func:`setting` / :func:`read_settings`, its ``Settings`` dataclass of top-level keys, one line per bad value.

Example::

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Settings:
    ...     num_epochs: int = setting(2, "epochs per unit", "int", minimum=1)
    ...     seeds: list = setting((0, 1, 2), "paired seeds", kind="seeds")
    >>> read_settings(Settings, {"num_epochs": 3, "seeds": "0 1"}, {"num_epochs": "general.yaml"})
    Settings(num_epochs=3, seeds=[0, 1])
"""

import copy
import dataclasses
import difflib
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple

from ...utils.checks import is_int, is_number
from ..errors import ConfigError

#: the default of a field the config must give
REQUIRED = object()


def setting(
    default: Any = REQUIRED,
    doc: str = "",
    kind: str = "any",
    minimum: Optional[float] = None,
    maximum: Optional[float] = None,
    choices: Sequence[Any] = (),
    optional: bool = False,
) -> Any:
    """A field of a protocol's ``Settings`` dataclass.

    Args:
        default: the value when the config leaves the key out (copied); :data:`REQUIRED` when the config must give it.
        doc: what the key does, in one line (the docs' key tables).
        kind: ``int``, ``float``, ``bool``, ``str``, ``mapping``, ``list``, ``seeds`` (a non-empty list of distinct
            non-negative ints; ``"0 1 2"`` from the command line counts), ``choice`` (one of ``choices``),
            ``name_pairs`` (``[[a, b], ...]``), or ``any`` (an object spec the Builder checks).
        minimum, maximum: bounds of a number.
        optional: ``null`` is allowed (and kept).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    meta = {"doc": doc, "kind": kind, "minimum": minimum, "maximum": maximum, "choices": tuple(choices)}
    meta["optional"] = optional or default is None
    if default is REQUIRED:
        return dataclasses.field(default=REQUIRED, metadata=meta)
    return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)


def _expect(where: str, what: str, value: Any) -> ConfigError:
    return ConfigError(f"{where}: expected {what}, got {value!r}")


def seed_list(value: Any, where: str = "seeds") -> List[int]:
    """``seeds`` as a list of distinct non-negative ints (``"0 1 2"``, ``"0,1,2"`` and one int count)."""
    seeds = value
    if isinstance(value, str):
        try:
            seeds = [int(s) for s in value.replace(",", " ").split()]
        except ValueError:
            seeds = value
    elif is_int(value):
        seeds = [int(value)]
    if not isinstance(seeds, (list, tuple)) or not seeds or any(not is_int(s) or s < 0 for s in seeds):
        raise _expect(where, "a non-empty list of non-negative integers (--seeds 0 1 2)", value)
    if len(set(seeds)) != len(seeds):
        raise _expect(where, "distinct seeds", value)
    return [int(s) for s in seeds]


def _name_pairs(value: Any) -> bool:
    pairs = value or []
    return isinstance(pairs, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(n, str) for n in p) for p in pairs
    )


#: kind -> (the check of a value, what the error says is expected, the value kept); ``seeds`` and ``choice`` aside
_KINDS: Dict[str, Tuple[Callable[[Any], bool], str, Callable[[Any], Any]]] = {
    "any": (lambda v: True, "", lambda v: v),
    "int": (is_int, "an integer", int),
    "float": (is_number, "a number", float),
    "bool": (lambda v: isinstance(v, bool), "true or false", lambda v: v),
    "str": (lambda v: isinstance(v, str) and bool(v), "a non-empty string", lambda v: v),
    "mapping": (lambda v: isinstance(v, dict), "a mapping", lambda v: v),
    "list": (lambda v: isinstance(v, (list, tuple)), "a list", list),
    "seeds": (lambda v: True, "", seed_list),  # (check_value calls seed_list with where)
    "choice": (lambda v: True, "", lambda v: v),  # (check_value checks meta["choices"])
    "name_pairs": (_name_pairs, "a list of [variant, baseline] pairs", lambda v: [tuple(p) for p in v or []]),
}
KINDS = tuple(_KINDS)


def check_value(value: Any, meta: Dict[str, Any], where: str) -> Any:
    """``value`` checked against a :func:`setting`'s metadata and normalised (ints, floats, seed lists, tuples)."""
    kind, low, high = meta["kind"], meta["minimum"], meta["maximum"]
    if value is None and meta["optional"]:
        return value
    if kind == "seeds":
        return seed_list(value, where)
    check, what, keep = _KINDS[kind]
    if kind == "choice":
        check, what = meta["choices"].__contains__, "one of " + ", ".join(map(str, meta["choices"]))
    what += (f" >= {low:g}" if low is not None else "") + (f" and <= {high:g}" if high is not None else "")
    if not check(value) or (low is not None and value < low) or (high is not None and value > high):
        raise _expect(where, what, value)
    return keep(value)


def misspelt_required(cls: type, config: Dict[str, Any]) -> Dict[str, str]:
    """``{key of config: required field of cls it misspells}`` for the required fields ``config`` lacks."""
    names = {f.name for f in dataclasses.fields(cls)}
    others = [str(k) for k in config if k not in names]
    out = {}
    for field in dataclasses.fields(cls):
        if field.default is REQUIRED and config.get(field.name) is None:
            close = difflib.get_close_matches(field.name, others, n=1)
            if close:
                out[close[0]] = field.name
    return out


def read_settings(cls: type, config: Dict[str, Any], sources: Optional[Dict[str, str]] = None, where: str = ""):
    """The dataclass ``cls`` filled from ``config``: every field from its key (its default when absent), checked by
    its :func:`setting` metadata; keys of ``config`` that are not fields are ignored (the loader refuses them).

    Args:
        where: what the error names when the key has no source (e.g. ``"variants.xml"``).

    Raises:
        ConfigError: one line ``"<file>: <key>: expected ..., got ..."`` per bad value (``"<file>: missing key
        <key>"``, also for a required key given as ``null``, naming a misspelt key when the config has one).
    """
    from ..config.loader import source_of
    from ..errors import Problems

    values, problems = {}, Problems()
    for field in dataclasses.fields(cls):
        meta = field.metadata
        here = f"{where or source_of(sources, field.name)}: {field.name}"
        values[field.name] = field.default_factory() if field.default_factory is not dataclasses.MISSING else None
        required = field.default is REQUIRED and not meta.get("optional")
        with problems.check():
            if field.name in config and not (required and config[field.name] is None):
                values[field.name] = check_value(config[field.name], meta, here) if meta else config[field.name]
            elif field.default is REQUIRED:
                typo = [k for k, name in misspelt_required(cls, config).items() if name == field.name]
                if typo:  # where the misspelt key was written (else where the key was expected)
                    source = source_of(sources, typo[0])
                    source = source if source != "config" else source_of(sources, field.name)
                    raise ConfigError(
                        f"{where or source}: {typo[0]}: missing key {field.name!r} (the config has {typo[0]!r}: a "
                        "misspelling?)"
                    )
                raise ConfigError(f"{where or source_of(sources, field.name)}: missing key {field.name!r}")
    problems.raise_any()
    return cls(**values)


def parse_columns(value: Any, where: str = "command line: --columns") -> Dict[str, str]:
    """``--columns label=category,path=image,split=subset`` as a mapping: the dataset's own parser
    (:func:`pml_extensions.datasets.image_csv_split.parse_columns`), its errors a ConfigError naming ``where``."""
    from ...datasets.image_csv_split import parse_columns as parse

    if not isinstance(value, (dict, str)):
        raise ConfigError(f"{where}: expected label=COLUMN,path=COLUMN[,split=COLUMN], got {value!r}")
    try:  # an unmapped column ("split=") stays "", as the configs saved before have it
        return {role: "" if column is None else column for role, column in parse(value).items()}
    except ValueError as e:  # "columns: <what is wrong>"
        raise ConfigError(f"{where}: {str(e).split(': ', 1)[-1]}") from None


@dataclasses.dataclass
class SearchSettings:
    """The keys of a search (``~BAYESIAN~`` markers), read by every protocol with an objective."""

    bayes_opt_iters: Optional[int] = setting(
        None, "Number of COMPLETE Optuna trials when the config has `~BAYESIAN~`-family markers.", "int", minimum=1
    )
    bayes_opt_max_failures_in_a_row: int = setting(
        5,
        "A search stops (one line, `stopped` in `search.json`) after this many failed trials in a row.",
        "int",
        minimum=1,
    )


class Protocol:
    """Base of every protocol: subclasses set ``name``, ``description`` and ``Settings`` and implement :meth:`run`;
    they may override :meth:`data_folder`, :meth:`objective`, :meth:`check` and :meth:`preflight`.

    Args:
        config: the merged config (:func:`pml_extensions.runner.protocols.load_config`).
        folder: the experiment folder; running again with the same folder resumes.
        sources: top-level key -> file, so errors name the file.
        log: a print-like function.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Settings: ClassVar[type] = type(None)
    #: the part of the ``--data_folder`` refusal after "the <name> protocol " (when :meth:`data_folder` refuses)
    data_folder_note: ClassVar[str] = "does not read a folder of your images"

    def __init__(self, config: Dict[str, Any], folder: str, sources: Optional[Dict[str, str]] = None, log=print):
        self.config = config
        self.folder = folder
        self.sources = sources if sources is not None else {}
        self.log = log
        self.preflown = False  # run_protocol ran preflight() before the experiment folder existed
        type(self).check(config, self.sources)
        self.settings = self.read(config, self.sources)

    @classmethod
    def keys(cls) -> Tuple[str, ...]:
        """The top-level keys this protocol reads (its ``Settings`` fields, the search's and ``protocol``)."""
        fields = dataclasses.fields(cls.Settings) + dataclasses.fields(SearchSettings)
        return ("protocol",) + tuple(dict.fromkeys(f.name for f in fields))

    @classmethod
    def read(cls, config: Dict[str, Any], sources: Optional[Dict[str, str]] = None):
        """The config's ``Settings``, checked (:func:`read_settings`)."""
        return read_settings(cls.Settings, config, sources)

    @classmethod
    def normalize(cls, config: Dict[str, Any], sources: Dict[str, str], log=None) -> Dict[str, Any]:
        """The config as this protocol reads it (older spellings of its keys mapped, one note each to ``log``),
        called by the loader after the key check. Default: unchanged."""
        return config

    @classmethod
    def check(cls, config: Dict[str, Any], sources: Optional[Dict[str, str]] = None):
        """Every check that needs no data and no model (``--dry-run`` included); subclasses add theirs. Returns the
        ``Settings`` it read (:meth:`read`)."""
        settings = cls.read(config, sources)
        read_settings(SearchSettings, config, sources)
        return settings

    @classmethod
    def data_folder(cls, path: str, is_csv: bool, columns: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """The config changes that make ``--data_folder PATH`` the dataset (``columns``: a CSV file's column mapping,
        ``{"label": "category", "path": "image"}``); a ConfigError (:attr:`data_folder_note`) when it takes none."""
        raise ConfigError(f"command line: --data_folder: the {cls.name} protocol {cls.data_folder_note}")

    @classmethod
    def objective(cls, results: Dict[str, Any], config: Dict[str, Any]) -> float:
        """The validation number a search maximises (never a test number); a ConfigError when there is none."""
        raise ConfigError(f"bayes_opt_iters: the {cls.name} protocol has no search objective")

    def preflight(self) -> None:
        """Every check of the data before any work, all problems in one refusal; writes nothing to an experiment
        folder that does not exist yet. Default: none."""

    def run(self) -> Dict[str, Any]:  # pragma: no cover - every protocol implements it
        """Run the experiment, write ``results.json`` (and the rest of the folder) and return the results."""
        raise NotImplementedError
