"""mkdocs hook: the pages generated from the code, so that the site cannot drift from the code.

* ``api/<module>.md``: one mkdocstrings page per public module of ``pml_extensions`` (a module none of whose path
  components starts with ``_``), listed under "API reference" in the navigation;
* ``changelog.md``: ``CHANGELOG.md``;
* every ``<!-- results:NAME -->`` block of a page: ``benchmarks/results/NAME.md``, by ``benchmarks/readme_tables.py``'s
  :func:`render` (the same code that fills the README's tables). In the repository the block holds one line that
  names that file (:func:`results_pointer`), so a page read on GitHub says where its table is;
* every ``<!-- config:NAME -->`` ... ``<!-- /config:NAME -->`` block: a table of config keys generated from the code
  (:func:`generated_blocks`), committed between its markers so that the page reads whole in the repository. The
  build writes it afresh; a committed block that differs from what the code gives is a warning (``python
  docs/_hooks/site.py`` rewrites them);
* after the build, any HTML or CSS file that would load a script, style sheet, font or image from another host
  is a warning (the site must work offline).

Where the key tables come from: the protocols' ``Settings`` dataclasses (each field's name, default and the ``doc`` of
its ``setting(...)``: ``GridSettings`` and ``SearchSettings`` of every protocol, the ``paired`` and ``mlrc``
protocols' own, and the settings of the plugins in ``benchmarks/protocols/``), the protocols' lookup table
(``PROTOCOLS``, each class's ``description``), powerful-benchmarker's older spellings (``mlrc/old_keys.py``), the PB
key defaults (``pb_keys.py``), the Builder's nested keys and the markers of ``loader.py``. The keys
that carry no documentation in the code (the ``config_general`` flags, the arguments of ``split_manager``,
``hook_container``, ``ensemble``, ``aggregator``, the nested keys, the markers, the RAML plugin's dataset keys) are
described in ``config_keys.yaml`` beside this file.

Everything is read from the source with :mod:`ast` (no import: the docs build needs neither torch nor the package
installed); ``tests/test_docs_site.py`` checks that what is read here equals what the code holds at run time. A
setting without a ``doc``, a key without a description in ``config_keys.yaml``, or a description of a key the code
no longer reads, is a warning, which ``mkdocs build --strict`` turns into an error.

Command line: ``python docs/_hooks/site.py`` rewrites the committed blocks of ``docs/``; ``--check`` exits 1 when
one differs.
"""

import ast
import importlib.util
import logging
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

import yaml

log = logging.getLogger("mkdocs.hooks.pml_extensions")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DOCS = os.path.join(ROOT, "docs")
PACKAGE = os.path.join(ROOT, "pml_extensions")
CONFIG = os.path.join(PACKAGE, "runner", "config")
PROTOCOLS = os.path.join(PACKAGE, "runner", "protocols")
PLUGINS = os.path.join(ROOT, "benchmarks", "protocols")
BENCHMARK_CONFIGS = os.path.join(ROOT, "benchmarks", "configs")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
DESCRIPTIONS = os.path.join(HERE, "config_keys.yaml")
API_NAV_TITLE = "API reference"

#: block name -> (file relative to the repository, class): the Settings dataclasses whose keys get a table
SETTINGS = {
    "grid": ("pml_extensions/runner/protocols/paired_protocol.py", "GridSettings"),
    "search": ("pml_extensions/runner/protocols/base.py", "SearchSettings"),
    "paired": ("pml_extensions/runner/protocols/paired/protocol.py", "Settings"),
    "mlrc": ("pml_extensions/runner/protocols/mlrc/protocol.py", "Settings"),
    "template_block": ("benchmarks/protocols/template_block/protocol.py", "Settings"),
    "localization": ("benchmarks/protocols/localization/protocol.py", "Settings"),
    "resolution_distillation": ("benchmarks/protocols/resolution_distillation/settings.py", "Settings"),
}
#: tables without a default column (the mlrc keys' values are powerful-benchmarker specs with PB's defaults)
NO_DEFAULTS = ("mlrc",)


class Required:
    """Stands for ``base.REQUIRED`` (a field the config must give) in what is read here."""

    def __repr__(self):
        return "REQUIRED"


REQUIRED = Required()


# ------------------------------------------------------------------------------------------ reading the code
class Source:
    """One Python file, parsed: its module-level assignments, functions and classes."""

    _cache: Dict[str, "Source"] = {}

    def __init__(self, path: str):
        with open(path, encoding="utf-8") as f:
            self.tree = ast.parse(f.read(), path)
        self.path = path
        self.names: Dict[str, ast.AST] = {}
        self.functions: Dict[str, ast.FunctionDef] = {}
        self.classes: Dict[str, ast.ClassDef] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.names[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.names[node.target.id] = node.value
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node

    @classmethod
    def of(cls, path: str) -> "Source":
        path = os.path.join(ROOT, path) if not os.path.isabs(path) else path
        if path not in cls._cache:
            cls._cache[path] = Source(path)
        return cls._cache[path]

    def where(self, name: str = "") -> str:
        rel = os.path.relpath(self.path, ROOT).replace(os.sep, "/")
        return f"{rel}: {name}" if name else rel

    def value(self, node: ast.AST, local: Optional[Dict[str, Any]] = None, where: str = "") -> Any:
        """A literal, allowing module-level names (and ``local`` bindings), ``REQUIRED``, ``+`` of sequences and
        ``tuple(x)`` / ``list(x)`` (what the key tables and settings use)."""
        local = local or {}
        if isinstance(node, ast.Name):
            if node.id in local:
                return local[node.id]
            if node.id == "REQUIRED":
                return REQUIRED
            if node.id not in self.names:
                raise ValueError(f"{self.where(where)}: {node.id} is not a module-level literal")
            return self.value(self.names[node.id], local, where)
        if isinstance(node, ast.Tuple):
            return tuple(self.value(e, local, where) for e in node.elts)
        if isinstance(node, ast.List):
            return [self.value(e, local, where) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.value(k, local, where): self.value(v, local, where) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left, local, where) + self.value(node.right, local, where)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("tuple", "list")
            and len(node.args) == 1
        ):
            return {"tuple": tuple, "list": list}[node.func.id](self.value(node.args[0], local, where))
        return ast.literal_eval(node)

    def table(self, name: str) -> Any:
        """The value of the module-level assignment ``name``."""
        if name not in self.names:
            raise KeyError(f"{self.where()}: no module-level {name}")
        return self.value(self.names[name], where=name)

    def class_attribute(self, cls: str, name: str) -> Any:
        """The literal a class body assigns to ``name`` (``None`` when it assigns none)."""
        if cls not in self.classes:
            raise KeyError(f"{self.where()}: no class {cls}")
        for node in self.classes[cls].body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == name and node.value is not None:
                    return self.value(node.value, where=f"{cls}.{name}")
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts):
                        if isinstance(t, ast.Name) and t.id == name:
                            return self.value(v, where=f"{cls}.{name}")
        return None


def read_table(path: str, name: str) -> Any:
    """The value of the module-level assignment ``name`` in the file ``path``, read without importing it."""
    return Source.of(path).table(name)


def _bind(fn: ast.FunctionDef, fn_source: Source, call: ast.Call, source: Source, local: Dict[str, Any], where: str):
    """``{parameter: value}`` of ``call`` (in ``source``, with ``local`` bindings) against the signature of ``fn``
    (defined in ``fn_source``), its defaults filled in."""
    params = [a.arg for a in fn.args.args]
    defaults = fn.args.defaults
    bound: Dict[str, Any] = {}
    for p, d in zip(params[len(params) - len(defaults) :], defaults):
        bound[p] = fn_source.value(d, where=where)
    for p, a in zip(params, call.args):
        bound[p] = source.value(a, local, where)
    for kw in call.keywords:
        bound[kw.arg] = source.value(kw.value, local, where)
    return bound


def _setting_call(node: ast.AST, source: Source, where: str, local: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The arguments of the ``setting(...)`` a field's value is: a direct call, or a call of a module-level function
    of the same file whose body returns one (``_doc(text)`` -> ``setting(None, text)``)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"{source.where(where)}: the field's value is not a setting(...) call")
    name = node.func.id
    if name == "setting":
        base = Source.of(os.path.join(PROTOCOLS, "base.py"))
        return _bind(base.functions["setting"], base, node, source, local or {}, where)
    fn = source.functions.get(name)
    returned = fn.body[-1] if fn is not None else None
    if not (isinstance(returned, ast.Return) and isinstance(returned.value, ast.Call)):
        raise ValueError(f"{source.where(where)}: {name}(...) is not setting(...) nor a function returning one")
    inner = _bind(fn, source, node, source, local or {}, where)
    return _setting_call(returned.value, source, where, inner)


def settings_fields(path: str, cls: str) -> List[Dict[str, Any]]:
    """The fields of the dataclass ``cls`` in ``path``, in order: ``{"name", "default", "doc"}`` each (``default`` is
    :data:`REQUIRED` for a field the config must give), its base classes of the same file first."""
    source = Source.of(path)
    if cls not in source.classes:
        raise KeyError(f"{source.where()}: no class {cls}")
    node = source.classes[cls]
    fields: Dict[str, Dict[str, Any]] = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in source.classes:
            for f in settings_fields(path, base.id):
                fields[f["name"]] = f
        elif not (isinstance(base, ast.Name) and base.id == "object"):
            raise ValueError(f"{source.where(cls)}: base class {ast.unparse(base)} is not in the same file")
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
            args = _setting_call(item.value, source, f"{cls}.{item.target.id}")
            fields[item.target.id] = {"name": item.target.id, "default": args["default"], "doc": args["doc"] or ""}
    return list(fields.values())


def _protocol_file(spec: str, folder: str = ROOT) -> Tuple[str, str]:
    """``package.module:Class`` -> (the module's file, the class name)."""
    module, _, cls = spec.partition(":")
    base = os.path.join(folder, *module.split("."))
    path = base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")
    return path, cls


def protocol_description(spec: str) -> str:
    """The ``description`` class attribute of the protocol class ``package.module:Class``."""
    path, cls = _protocol_file(spec)
    return Source.of(path).class_attribute(cls, "description") or ""


def plugin_class(name: str) -> Tuple[str, str]:
    """(file, class name) of ``benchmarks.protocols.<name>``'s ``PROTOCOL`` (its ``__init__`` imports it from a
    module of the package)."""
    init = Source.of(os.path.join(PLUGINS, name, "__init__.py"))
    for node in init.tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and any(a.name == "PROTOCOL" for a in node.names):
            module = Source.of(os.path.join(PLUGINS, name, *(node.module or "").split(".")) + ".py")
            target = module.names.get("PROTOCOL")
            if isinstance(target, ast.Name):
                return module.path, target.id
    raise ValueError(f"{init.where()}: no `from .module import PROTOCOL` naming a class")


def plugin_configs() -> Dict[str, List[str]]:
    """``protocol:`` value -> the configs under ``benchmarks/configs/`` that name it (in any of their files)."""
    out: Dict[str, List[str]] = {}
    for name in sorted(os.listdir(BENCHMARK_CONFIGS)):
        folder = os.path.join(BENCHMARK_CONFIGS, name)
        for dirpath, _, files in sorted(os.walk(folder)):
            for file in sorted(files):
                if file.endswith(".yaml"):
                    with open(os.path.join(dirpath, file), encoding="utf-8") as f:
                        value = (yaml.safe_load(f) or {}).get("protocol")
                    if value and name not in out.get(value, []):
                        out.setdefault(value, []).append(name)
    return out


def marker_ops() -> Tuple[str, ...]:
    """The key markers of ``loader._MARKER`` (``OVERRIDE``, ``APPLY``, ...), in the regex's order."""
    with open(os.path.join(CONFIG, "loader.py"), encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"\(\?P<op>([A-Z_|]+)\)", text)
    if found is None:
        raise ValueError("runner/config/loader.py: the _MARKER regex has no (?P<op>...) group")
    return tuple(found.group(1).split("|"))


def code_tables() -> Dict[str, Any]:
    """Everything the generated blocks are made from (see the module docstring)."""
    pb = ev = os.path.join(CONFIG, "pb_keys.py")
    old = os.path.join(PROTOCOLS, "mlrc", "old_keys.py")
    builder = os.path.join(PACKAGE, "runner", "objects", "builder.py")
    protocols = read_table(os.path.join(PROTOCOLS, "__init__.py"), "PROTOCOLS")
    plugins = read_table(os.path.join(PLUGINS, "__init__.py"), "PLUGINS")
    plugin_classes = {name: plugin_class(name) for name in plugins}
    return {
        "protocols": protocols,
        "protocol_descriptions": {name: protocol_description(spec) for name, spec in protocols.items()},
        "default_protocols": read_table(os.path.join(PROTOCOLS, "__init__.py"), "DEFAULT_PROTOCOLS"),
        "plugins": {
            f"benchmarks.protocols.{name}": f"benchmarks.protocols.{name}:{cls}"
            for name, (_, cls) in plugin_classes.items()
        },
        "plugin_descriptions": {
            f"benchmarks.protocols.{name}": Source.of(path).class_attribute(cls, "description") or ""
            for name, (path, cls) in plugin_classes.items()
        },
        "plugin_configs": plugin_configs(),
        "settings": {name: settings_fields(path, cls) for name, (path, cls) in SETTINGS.items()},
        "flags": read_table(pb, "_FLAGS"),
        "split_manager": read_table(pb, "_DEFAULT_SPLIT"),
        "hook_container": read_table(pb, "_DEFAULT_HOOKS"),
        "ensemble": read_table(ev, "_DEFAULT_ENSEMBLE"),
        "tester": read_table(ev, "_TESTER"),
        "pb_only": read_table(ev, "_PB_ONLY"),
        "old_keys": read_table(old, "OLD_KEYS"),
        "old_refused": read_table(old, "_OLD_REFUSED"),
        "resolution_dataset_keys": read_table(
            os.path.join(PLUGINS, "resolution_distillation", "settings.py"), "DATASET_KEYS"
        ),
        "prototype_init_keys": read_table(
            os.path.join(PACKAGE, "trunks", "histogram_pooling.py"), "PROTOTYPE_INIT_KEYS"
        ),
        "param_group_keys": read_table(builder, "PARAM_GROUP_KEYS"),
        "markers": marker_ops(),
    }


# ------------------------------------------------------------------------------------------ the generated blocks
def _yaml(v: Any) -> str:
    """A value as YAML flow style (what a config would write)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml(x) for x in v) + "]"
    if isinstance(v, str):
        return yaml.safe_dump(v, default_flow_style=True, width=1000).split("\n")[0]
    return repr(v)


def _code(v: Any) -> str:
    return f"`{_yaml(v)}`"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def load_descriptions(path: str = DESCRIPTIONS) -> Dict[str, Dict[str, str]]:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _describe(section: Dict[str, str], key: str, problems: List[str], what: str) -> str:
    text = (section or {}).get(key)
    if not text:
        problems.append(f"{what} {key!r} has no description in docs/_hooks/config_keys.yaml")
        return "*(no description yet)*"
    return _cell(text)


def _stale(section: Dict[str, str], known, problems: List[str], what: str) -> None:
    for key in section or {}:
        if key not in known:
            problems.append(f"docs/_hooks/config_keys.yaml describes {what} {key!r}, which the code does not read")


def settings_table(name: str, fields: List[Dict[str, Any]], problems: List[str]) -> str:
    """``| key | default | meaning |`` of one Settings dataclass (:data:`NO_DEFAULTS`: without the default)."""
    path, cls = SETTINGS.get(name, ("", name))
    defaults = name not in NO_DEFAULTS
    rows = ["| key | default | meaning |", "|---|---|---|"] if defaults else ["| key | meaning |", "|---|---|"]
    for f in fields:
        doc = f["doc"]
        if not doc.strip():
            problems.append(f"{path}: {cls}.{f['name']} has no doc (the doc argument of its setting(...))")
            doc = "*(no description yet)*"
        default = "required" if f["default"] is REQUIRED else _code(f["default"])
        cells = [f"`{f['name']}`", default, _cell(doc)] if defaults else [f"`{f['name']}`", _cell(doc)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def generated_blocks(
    tables: Optional[Dict[str, Any]] = None, descriptions: Optional[Dict[str, Any]] = None
) -> Tuple[Dict[str, str], List[str]]:
    """``({block name: markdown}, problems)`` for the ``<!-- config:NAME -->`` blocks of the pages."""
    t = tables or code_tables()
    d = descriptions if descriptions is not None else load_descriptions()
    problems: List[str] = []
    out: Dict[str, str] = {}

    defaults = {p: layout for layout, p in t["default_protocols"].items()}
    rows = ["| `protocol:` | class | what it runs |", "|---|---|---|"]
    for name, spec in t["protocols"].items():
        note = f" (default, {defaults[name]} layout)" if name in defaults else ""
        rows.append(f"| `{name}`{note} | `{spec}` | {_cell(t['protocol_descriptions'].get(name, ''))} |")
    out["protocols"] = "\n".join(rows)

    rows = ["| `protocol:` | class | what it runs | configs in `benchmarks/configs/` |", "|---|---|---|---|"]
    for name, spec in t["plugins"].items():
        configs = ", ".join(f"`{c}`" for c in t["plugin_configs"].get(name, [])) or "—"
        rows.append(f"| `{name}` | `{spec}` | {_cell(t['plugin_descriptions'].get(name, ''))} | {configs} |")
    out["plugins"] = "\n".join(rows)

    for name, fields in t["settings"].items():
        out[name] = settings_table(name, fields, problems)

    rows = ["| `datasets: {NAME: {...}}` key | meaning |", "|---|---|"]
    res = d.get("resolution_distillation_datasets") or {}
    for key in t["resolution_dataset_keys"]:
        rows.append(f"| `{key}` | {_describe(res, key, problems, 'resolution_distillation dataset key')} |")
    _stale(res, t["resolution_dataset_keys"], problems, "resolution_distillation dataset key")
    out["resolution_distillation_datasets"] = "\n".join(rows)

    flags = d.get("config_general") or {}
    rows = ["| flag | default | accepted values | meaning / why other values are refused |", "|---|---|---|---|"]
    for key, (default, allowed, reason) in t["flags"].items():
        accepted = ", ".join(_code(a) for a in allowed)
        text = _describe(flags, key, problems, "config_general flag")
        rows.append(f"| `{key}` | {_code(default)} | {accepted} | {text}{(' — ' + _cell(reason)) if reason else ''} |")
    _stale(flags, t["flags"], problems, "config_general flag")
    out["flags"] = "\n".join(rows)

    for section, table, cls in (
        ("split_manager", t["split_manager"], "ClassDisjointSplitManager"),
        ("hook_container", t["hook_container"], "HookContainer"),
        ("ensemble", t["ensemble"], "ConcatenateEmbeddings"),
        ("aggregator", {"split_to_aggregate": "val"}, "MeanAggregator"),
    ):
        desc = d.get(section) or {}
        rows = [f"`{section}: {{{cls}: {{...}}}}`", "", "| argument | default | meaning |", "|---|---|---|"]
        for key, default in table.items():
            rows.append(f"| `{key}` | {_code(default)} | {_describe(desc, key, problems, section + ' argument')} |")
        _stale(desc, table, problems, section + " argument")
        refused = t["pb_only"].get(section) or ()
        if refused:
            rows += [
                "",
                "Refused by name (powerful-benchmarker's, not implemented here): "
                + ", ".join(f"`{r}`" for r in refused)
                + ".",
            ]
        out[section] = "\n".join(rows)
    out["tester"] = (
        f"`tester: {{{t['tester']}: {{...}}}}` (the default class): every keyword argument of the tester class (PML's "
        "`BaseTester` and the classes between it and the named tester), plus powerful-benchmarker's `reference_set`."
    )

    rows = ["| older spelling | read as | note |", "|---|---|---|"]
    for old, (parent, arg) in t["old_keys"].items():
        rows.append(f"| `{old}` | `{parent}~APPLY~2: {{{arg}: ...}}` | powerful-benchmarker before v0.9.29; one note |")
    for old, reason in t["old_refused"].items():
        rows.append(f"| `{old}` | refused | {_cell(reason)} |")
    out["old-keys"] = "\n".join(rows)

    markers = d.get("markers") or {}
    rows = ["| marker | example | meaning |", "|---|---|---|"]
    for op in t["markers"]:
        entry = markers.get(op) or {}
        if not entry:
            problems.append(f"marker ~{op}~ has no description in docs/_hooks/config_keys.yaml")
        meaning = _cell(entry.get("meaning", "*(no description yet)*"))
        rows.append(f"| `~{op}~` | `{_cell(entry.get('example', ''))}` | {meaning} |")
    _stale(markers, t["markers"], problems, "marker")
    out["markers"] = "\n".join(rows)

    nested = d.get("nested") or {}
    paired = {f["name"]: f["default"] for f in t["settings"]["paired"]}
    validation = tuple(paired.get("validation") or ()) if isinstance(paired.get("validation"), dict) else ()
    rows = ["| key | arguments | meaning |", "|---|---|---|"]
    for key, args in (
        ("validation", validation),
        ("prototype_init", t["prototype_init_keys"]),
        ("optimizers.*.param_groups[]", t["param_group_keys"]),
    ):
        args_text = ", ".join(f"`{a}`" for a in args)
        rows.append(f"| `{key}` | {args_text} | {_describe(nested, key, problems, 'nested key')} |")
    _stale(nested, ("validation", "prototype_init", "optimizers.*.param_groups[]"), problems, "nested key")
    out["nested"] = "\n".join(rows)
    return out, problems


#: a committed block: ``<!-- config:NAME -->`` + its generated text + ``<!-- /config:NAME -->``
CONFIG_BLOCK = re.compile(r"<!-- config:([a-z_-]+) -->\n(.*?)<!-- /config:\1 -->", re.S)
#: the opening markers alone (a marker without its closing pair is an error)
CONFIG_MARKER = re.compile(r"<!-- config:([a-z_-]+) -->")
RESULTS_BLOCK = re.compile(r"<!-- results:([A-Za-z0-9_.-]+) -->\n(.*?)<!-- /results:\1 -->", re.S)


def results_pointer(name: str, page: str) -> str:
    """The line a ``results:NAME`` block of the page ``page`` (relative to ``docs/``) holds in the repository."""
    target = os.path.relpath(os.path.join(RESULTS, name + ".md"), os.path.dirname(os.path.join(DOCS, page)))
    target = target.replace(os.sep, "/")
    return (
        f"*The table is [`benchmarks/results/{name}.md`]({target}); the site shows it here "
        "(`tox -e docs` builds the site).*\n"
    )


def fill_committed(text: str, page: str, blocks: Dict[str, str]) -> Tuple[str, List[str]]:
    """``text`` with every config block holding its generated table and every results block its pointer line;
    also the names of the config blocks the page uses that :func:`generated_blocks` does not make."""
    unknown = [m.group(1) for m in CONFIG_MARKER.finditer(text) if m.group(1) not in blocks]

    def config(match):
        name = match.group(1)
        if name not in blocks:
            return match.group(0)
        return f"<!-- config:{name} -->\n{blocks[name]}\n<!-- /config:{name} -->"

    def results(match):
        name = match.group(1)
        return f"<!-- results:{name} -->\n{results_pointer(name, page)}<!-- /results:{name} -->"

    return RESULTS_BLOCK.sub(results, CONFIG_BLOCK.sub(config, text)), unknown


def pages(docs: str = DOCS) -> Dict[str, str]:
    """``{path relative to docs/: text}`` of every Markdown page (not the hooks)."""
    out = {}
    for folder, dirs, names in os.walk(docs):
        dirs[:] = sorted(x for x in dirs if x != "_hooks")
        for name in sorted(names):
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    out[os.path.relpath(path, docs).replace(os.sep, "/")] = f.read()
    return out


# ------------------------------------------------------------------------------------------ API pages
def public_modules(package_dir: str = PACKAGE) -> List[str]:
    """Dotted names of the public modules (no path component starting with ``_``; packages by their name)."""
    out = []
    base = os.path.dirname(package_dir)
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(
            x for x in dirs if not x.startswith(("_", ".")) and os.path.isfile(os.path.join(folder, x, "__init__.py"))
        )
        rel = os.path.relpath(folder, base).split(os.sep)
        for name in sorted(files):
            if not name.endswith(".py") or (name.startswith("_") and name != "__init__.py"):
                continue
            out.append(".".join(rel if name == "__init__.py" else rel + [name[:-3]]))
    return sorted(out)


def _own_definitions(path: str) -> List[str]:
    """Public classes and functions a file defines itself (not the names it imports)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")]


def api_page(module: str) -> str:
    """A package's page shows its docstring and what its ``__init__`` defines itself (its re-exported names have
    their own modules' pages); a module's page shows everything public in it."""
    folder = os.path.join(ROOT, *module.split("."))
    if not os.path.isdir(folder):
        return f"# `{module}`\n\n::: {module}\n"
    own = _own_definitions(os.path.join(folder, "__init__.py"))
    members = "[" + ", ".join(own) + "]" if own else "false"
    return f"# `{module}`\n\n::: {module}\n    options:\n      members: {members}\n"


def api_src(module: str) -> str:
    return "api/" + module.replace(".", "/") + ".md"


def api_nav(modules: List[str]) -> List[Any]:
    """Nav entries: one section per sub-package of ``pml_extensions`` (the runner per floor)."""
    groups: Dict[str, List[Any]] = {}
    for m in modules:
        parts = m.split(".")
        group = ".".join(parts[:3]) if parts[1:2] == ["runner"] and len(parts) > 3 else ".".join(parts[:2])
        groups.setdefault(group, []).append({(m[len(group) + 1 :] or m) if m != group else m: api_src(m)})
    nav: List[Any] = []
    for group, entries in groups.items():
        nav.append(entries[0] if len(entries) == 1 else {group: entries})
    return nav


# ------------------------------------------------------------------------------------------ mkdocs events
def _load_readme_tables():
    spec = importlib.util.spec_from_file_location("readme_tables", os.path.join(ROOT, "benchmarks", "readme_tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fill_api_nav(nav, entries) -> bool:
    for i, item in enumerate(nav or []):
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if title == API_NAV_TITLE:
                nav[i] = {title: ([value] if isinstance(value, str) else list(value or [])) + entries}
                return True
            if isinstance(value, list) and _fill_api_nav(value, entries):
                return True
    return False


def on_config(config, **kwargs):
    _cache.clear()  # `mkdocs serve` rebuilds in one process: read the code afresh each time
    Source._cache.clear()
    entries = api_nav(public_modules())
    if not _fill_api_nav(config["nav"], entries):
        log.warning(f"mkdocs.yml: the nav has no '{API_NAV_TITLE}' section for the generated API pages")
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for module in public_modules():
        files.append(File.generated(config, api_src(module), content=api_page(module)))
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        files.append(File.generated(config, "changelog.md", content=f.read()))
    return files


_cache: Dict[str, Any] = {}


def _blocks() -> Dict[str, str]:
    if "blocks" not in _cache:
        blocks, problems = generated_blocks()
        for problem in problems:
            log.warning(problem)
        _cache["blocks"] = blocks
    return _cache["blocks"]


def on_page_markdown(markdown, page, config, files, **kwargs):
    src = page.file.src_path.replace(os.sep, "/")
    if CONFIG_MARKER.search(markdown):
        blocks = _blocks()
        for name in [m.group(1) for m in CONFIG_MARKER.finditer(markdown) if m.group(1) not in blocks]:
            log.warning(f"docs/{src}: unknown generated block config:{name}")
        found = CONFIG_BLOCK.findall(markdown)
        if len(found) != len(CONFIG_MARKER.findall(markdown)):
            log.warning(f"docs/{src}: a <!-- config:NAME --> marker without its <!-- /config:NAME --> pair")
        for name, body in found:
            if name in blocks and body != blocks[name] + "\n":
                log.warning(
                    f"docs/{src}: the committed config:{name} table differs from what the code gives; run "
                    "python docs/_hooks/site.py"
                )
        markdown = CONFIG_BLOCK.sub(
            lambda m: f"\n{blocks[m.group(1)]}\n" if m.group(1) in blocks else m.group(0), markdown
        )
    if "<!-- results:" in markdown or "<!-- headline:" in markdown or "<!-- summary:" in markdown:
        markdown = _load_readme_tables().render(markdown, keep_headlines=True)  # committed, checked by the tests
    return markdown


#: what a page may load from outside the site: nothing (links a reader clicks are fine)
_EXTERNAL_LOAD = re.compile(
    r"<(?:script|img|iframe|source|audio|video)\b[^>]*\bsrc=[\"']?(?:https?:)?//[^\"' >]+"
    r"|<link\b[^>]*\bhref=[\"']?(?:https?:)?//[^\"' >]+"
    r"|@import\s+(?:url\()?[\"']?(?:https?:)?//|url\([\"']?(?:https?:)?//",
    re.I,
)


def external_loads(site_dir: str) -> List[str]:
    """``"<file>: <tag>"`` for every resource a built HTML or CSS file would fetch from another host."""
    found = []
    for folder, _, names in os.walk(site_dir):
        for name in names:
            if name.endswith((".html", ".css")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for match in _EXTERNAL_LOAD.finditer(f.read()):
                        found.append(f"{os.path.relpath(path, site_dir)}: {match.group(0)[:120]}")
    return found


def on_post_build(config, **kwargs):
    for problem in external_loads(config["site_dir"]):
        log.warning(f"the site loads a resource from another host (it must work offline): {problem}")


# ------------------------------------------------------------------------------------------ command line
def main(argv: Optional[List[str]] = None) -> int:
    """Rewrite the committed blocks of every page (``--check``: exit 1 when one differs, writing nothing)."""
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    blocks, problems = generated_blocks()
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    stale = []
    for page, text in pages().items():
        new, unknown = fill_committed(text, page, blocks)
        for name in unknown:
            print(f"warning: docs/{page}: unknown generated block config:{name}", file=sys.stderr)
        if new != text:
            stale.append(page)
            if not check:
                with open(os.path.join(DOCS, page), "w", encoding="utf-8") as f:
                    f.write(new)
    if not stale:
        print("the generated blocks of docs/ equal what the code gives")
    elif check:
        print(
            f"generated blocks that differ from the code in docs/: {', '.join(stale)}; run python docs/_hooks/site.py"
        )
    else:
        print(f"rewritten: {', '.join(stale)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
