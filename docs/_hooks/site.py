"""mkdocs hook: the pages generated at build time, so that the site cannot drift from the code.

* ``api/<module>.md``: one mkdocstrings page per public module of ``pml_extensions`` (a module none of whose path
  components starts with ``_``), listed under "API reference" in the navigation;
* ``changelog.md``: ``CHANGELOG.md``;
* every ``<!-- results:NAME -->`` block of a page: ``benchmarks/results/NAME.md``, by
  ``benchmarks/readme_tables.py``'s :func:`render` (the same code that fills the README's tables);
* every ``<!-- config:TABLE -->`` marker: a table of the runner's config keys read from the code's own tables
  (``runner/config/keys.py``, ``pb_keys.py``, ``eval_keys.py``, ``old_keys.py``, ``syntax.py``, the protocols'
  lookup table, the resolution protocol's settings), described by ``config_keys.yaml`` beside this file;
* after the build, any HTML or CSS file that would load a script, style sheet, font or image from another host
  is a warning (the site must work offline);
* a page that another branch is still writing (:data:`PENDING`) gets a placeholder saying so while its file is
  missing from ``docs/``.

The code's tables are read from the source with :mod:`ast` (no import: the docs build needs neither torch nor the
package installed); ``tests/test_docs_site.py`` checks that what is read here equals what the code holds at run time
and that every key the code accepts is on the page. A key without a description in ``config_keys.yaml``, or a
description of a key the code no longer reads, is a warning, which ``mkdocs build --strict`` turns into an error.
"""

import ast
import importlib.util
import logging
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import yaml

log = logging.getLogger("mkdocs.hooks.pml_extensions")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "pml_extensions")
CONFIG = os.path.join(PACKAGE, "runner", "config")
PROTOCOLS = os.path.join(PACKAGE, "runner", "protocols")
DESCRIPTIONS = os.path.join(HERE, "config_keys.yaml")

#: pages other branches write now: src path -> (title, what it will hold); a placeholder stands in while missing
PENDING = {
    "own_data.md": ("Your own data", "training and evaluating on your own image folders"),
    "search.md": ("Hyper-parameter search", "the `~BAYESIAN~` markers and the Optuna study"),
    "feature_cache.md": ("Feature cache", "caching a frozen trunk prefix's features"),
}
API_NAV_TITLE = "API reference"
PROTOCOL_NAMES = ("mlrc", "xml_vs_gap", "resolution_distillation")


# ------------------------------------------------------------------------------------------ reading the code
def _assignments(path: str) -> Dict[str, ast.AST]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _value(node: ast.AST, names: Dict[str, ast.AST], where: str) -> Any:
    """A literal, allowing module-level names, ``+`` of tuples and ``tuple(x)`` (what the key tables use)."""
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(f"{where}: {node.id} is not a module-level literal")
        return _value(names[node.id], names, where)
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, names, where) for e in node.elts)
    if isinstance(node, ast.List):
        return [_value(e, names, where) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k, names, where): _value(v, names, where) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left, names, where) + _value(node.right, names, where)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "tuple"
        and len(node.args) == 1
    ):
        return tuple(_value(node.args[0], names, where))
    return ast.literal_eval(node)


def read_table(path: str, name: str) -> Any:
    """The value of the module-level assignment ``name`` in the file ``path``, read without importing it."""
    names = _assignments(path)
    if name not in names:
        raise KeyError(f"{path}: no module-level {name}")
    return _value(names[name], names, f"{path}: {name}")


def marker_ops() -> Tuple[str, ...]:
    """The key markers of ``syntax._MARKER`` (``OVERRIDE``, ``APPLY``, ...), in the regex's order."""
    with open(os.path.join(CONFIG, "syntax.py"), encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"\(\?P<op>([A-Z_|]+)\)", text)
    if found is None:
        raise ValueError("runner/config/syntax.py: the _MARKER regex has no (?P<op>...) group")
    return tuple(found.group(1).split("|"))


def code_tables() -> Dict[str, Any]:
    """Every key table the config pages are generated from (see the module docstring)."""
    keys, pb, ev, old = (os.path.join(CONFIG, n) for n in ("keys.py", "pb_keys.py", "eval_keys.py", "old_keys.py"))
    settings = os.path.join(PROTOCOLS, "resolution_distillation", "settings.py")
    builder = os.path.join(PACKAGE, "runner", "objects", "builder.py")
    protocols = os.path.join(PROTOCOLS, "__init__.py")
    return {
        "protocols": read_table(protocols, "PROTOCOLS"),
        "protocol_descriptions": read_table(protocols, "DESCRIPTIONS"),
        "default_protocol": read_table(protocols, "DEFAULT_PROTOCOL"),
        "protocol_keys": read_table(keys, "PROTOCOL_KEYS"),
        "flags": read_table(pb, "_FLAGS"),
        "split_manager": read_table(pb, "_DEFAULT_SPLIT"),
        "hook_container": read_table(pb, "_DEFAULT_HOOKS"),
        "ensemble": read_table(ev, "_DEFAULT_ENSEMBLE"),
        "tester": read_table(ev, "_TESTER"),
        "pb_only": read_table(ev, "_PB_ONLY"),
        "old_keys": read_table(old, "OLD_KEYS"),
        "old_refused": read_table(old, "_OLD_REFUSED"),
        "resolution_job_keys": read_table(old, "RESOLUTION_JOB_KEYS"),
        "old_top_level_keys": read_table(old, "OLD_TOP_LEVEL_KEYS"),
        "resolution_defaults": read_table(settings, "JOB_DEFAULTS"),
        "resolution_dataset_keys": read_table(settings, "DATASET_KEYS"),
        "validation_keys": read_table(settings, "VALIDATION_KEYS"),
        "prototype_init_keys": read_table(builder, "PROTOTYPE_INIT_KEYS"),
        "param_group_keys": read_table(builder, "PARAM_GROUP_KEYS"),
        "markers": marker_ops(),
    }


# ------------------------------------------------------------------------------------------ the config pages
def _code(v: Any) -> str:
    if v is None:
        return "`null`"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, str):
        return f"`{v}`"
    return f"`{v!r}`"


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


def config_tables(tables: Optional[Dict[str, Any]] = None, descriptions=None) -> Tuple[Dict[str, str], List[str]]:
    """``({marker name: markdown}, problems)`` for the ``<!-- config:NAME -->`` markers of ``docs/configs.md``."""
    t = tables or code_tables()
    d = descriptions if descriptions is not None else load_descriptions()
    problems: List[str] = []
    out = {}

    rows = ["| protocol | module | what it runs |", "|---|---|---|"]
    for name, module in t["protocols"].items():
        default = " (default)" if name == t["default_protocol"] else ""
        rows.append(f"| `{name}`{default} | `{module}` | {_cell(t['protocol_descriptions'].get(name, ''))} |")
    out["protocols"] = "\n".join(rows)

    protocols = list(t["protocol_keys"])
    all_keys = list(dict.fromkeys(k for p in protocols for k in t["protocol_keys"][p]))
    top = d.get("top_level") or {}
    rows = ["| key | " + " | ".join(f"`{p}`" for p in protocols) + " | meaning |", "|---" * (len(protocols) + 2) + "|"]
    for key in sorted(all_keys):
        marks = " | ".join("✓" if key in t["protocol_keys"][p] else "" for p in protocols)
        rows.append(f"| `{key}` | {marks} | {_describe(top, key, problems, 'top-level key')} |")
    _stale(top, all_keys, problems, "top-level key")
    out["top-level"] = "\n".join(rows)

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
                + ", ".join(map(_code, refused))
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
    for key in t["resolution_job_keys"]:
        new = "`models.embedder.RetrievalHead.out_dim`" if key == "embedding_dim" else f"top-level `{key}`"
        rows.append(f"| `resolution_job: {{{key}: ...}}` | {new} | the resolution protocol before the floor plan |")
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

    rows = ["| key | default | meaning |", "|---|---|---|"]
    res = d.get("resolution_distillation") or {}
    for key, default in t["resolution_defaults"].items():
        shown = "required" if default is None and key in ("datasets", "models") else _code(default)
        rows.append(f"| `{key}` | {shown} | {_describe(top, key, problems, 'top-level key')} |")
    dataset_rows = ["| `datasets: {NAME: {...}}` key | meaning |", "|---|---|"]
    for key in t["resolution_dataset_keys"]:
        dataset_rows.append(f"| `{key}` | {_describe(res, key, problems, 'resolution dataset key')} |")
    _stale(res, t["resolution_dataset_keys"], problems, "resolution dataset key")
    out["resolution"] = "\n".join(rows) + "\n\n" + "\n".join(dataset_rows)

    nested = d.get("nested") or {}
    rows = ["| key | arguments | meaning |", "|---|---|---|"]
    for key, args in (
        ("validation", t["validation_keys"]),
        ("prototype_init", t["prototype_init_keys"]),
        ("optimizers.*.param_groups[]", t["param_group_keys"]),
    ):
        rows.append(f"| `{key}` | {', '.join(map(_code, args))} | {_describe(nested, key, problems, 'nested key')} |")
    out["nested"] = "\n".join(rows)
    return out, problems


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
    for src, (title, what) in PENDING.items():
        if files.get_file_from_path(src) is None:
            log.info(f"docs/{src} is not here yet (another branch writes it): a placeholder page stands in")
            files.append(
                File.generated(
                    config,
                    src,
                    content=f'# {title}\n\n!!! note "Placeholder"\n    This page ({what}) is being written on '
                    f"another branch; until it is merged, [Quick start](quickstart.md) and "
                    f"[Runner and configs](runner.md) cover the basics.\n",
                ),
            )
    return files


_CONFIG_BLOCK = re.compile(r"<!-- config:([a-z_-]+) -->")
_cache: Dict[str, Any] = {}


def on_page_markdown(markdown, page, config, files, **kwargs):
    if "<!-- results:" in markdown:
        markdown = _load_readme_tables().render(markdown)
    if _CONFIG_BLOCK.search(markdown):
        if "config" not in _cache:
            _cache["config"] = config_tables()
            for problem in _cache["config"][1]:
                log.warning(problem)
        blocks = _cache["config"][0]

        def sub(match):
            name = match.group(1)
            if name not in blocks:
                log.warning(f"{page.file.src_path}: unknown generated block config:{name}")
                return match.group(0)
            return blocks[name]

        markdown = _CONFIG_BLOCK.sub(sub, markdown)
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
