"""``python -m pml_extensions run`` (also ``pml-extensions run``): run a config folder in
powerful-benchmarker's MLRC layout with the MLRC protocol.

Usage::

    python -m pml_extensions run CONFIG [--variant quick] [--experiment_name NAME]
        [--root_experiment_folder DIR] [--config_general [default, other]] ...
        [--key value | --key~OVERRIDE~ {...} | --key~APPLY~2 {...} ...]
    python -m pml_extensions run --list [ROLE]
    torchrun --nproc_per_node 2 -m pml_extensions run CONFIG ...      (gloo on CPU, nccl on GPU)

``CONFIG`` is a folder holding ``config_general/``, ``config_models/`` ... or the name of a shipped config
(``pml_extensions/configs/<name>``: contrastive, contrastive_xml, proxy_anchor, proxy_anchor_xml,
template_block, explanation, resolution_distillation). ``--variant NAME`` merges ``NAME.yaml`` after ``default.yaml`` in every folder
that has one (the shipped configs have ``quick``: embedded glyph data, minutes on 2 CPU cores).
``--config_<folder> [a, b]`` chooses the files of one folder explicitly. Every other ``--key value`` is merged
into the config with powerful-benchmarker's syntax.
``--progress`` shows PML's progress bars. The experiment goes to
``<root_experiment_folder>/<experiment_name>`` (default ``experiments/<config>[_<variant>]``);
running the same command again resumes it. Exit status: 0 done, 2 config error (one line on stderr).
"""

import os
import sys
from typing import List, Optional

from .factory import ConfigError

RUNNER_KEYS = (
    "experiment_name",
    "root_experiment_folder",
    "variant",
    "config_root",
    "list",
    "report_only",
    "progress",
)


def _configs_dir() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def find_config_root(name_or_path: str) -> str:
    """A folder path, or the name of a shipped MLRC-layout config.

    Raises:
        ConfigError: naming what was looked for and the shipped names.
    """
    from .config_loader import CONFIG_FOLDERS

    if os.path.isdir(name_or_path):
        return name_or_path
    shipped = os.path.join(_configs_dir(), name_or_path)
    if os.path.isdir(shipped):
        return shipped
    names = (
        sorted(
            d
            for d in os.listdir(_configs_dir())
            if os.path.isdir(os.path.join(_configs_dir(), d, CONFIG_FOLDERS[0]))
        )
        if os.path.isdir(_configs_dir())
        else []
    )
    raise ConfigError(f"{name_or_path}: missing config folder (shipped MLRC configs: {', '.join(names)})")


def _variant_selection(root: str, variant: str, selection: dict) -> dict:
    from .config_loader import CONFIG_FOLDERS

    found = False
    out = dict(selection)
    for folder in CONFIG_FOLDERS:
        if os.path.isfile(os.path.join(root, folder, f"{variant}.yaml")):
            found = True
            out.setdefault(folder, ["default", variant])
    if not found:
        raise ConfigError(f"{root}: --variant {variant}: no config folder has {variant}.yaml")
    return out


def _quiet_progress_bars():
    """PML's trainers and testers draw tqdm bars with no switch; the CLI (an application) turns them off
    unless ``--progress`` is given."""
    from functools import partialmethod

    import tqdm

    if not getattr(tqdm.tqdm, "_pml_extensions_quiet", False):
        tqdm.tqdm.__init__ = partialmethod(tqdm.tqdm.__init__, disable=True)
        tqdm.tqdm._pml_extensions_quiet = True


def _list(role: Optional[str]) -> int:
    from .registry import ROLES, classes_for_role

    for r in [role] if role else ROLES:
        if r not in ROLES:
            raise ConfigError(f"command line: --list: unknown role {r!r}; choose from {', '.join(ROLES)}")
        ours = classes_for_role(r, include_stock=False)
        print(f"{r}: {', '.join(sorted(ours)) or '-'}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        return _main(argv)
    except ConfigError as e:
        print(f"config error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2


def _run_resolution_distillation(config: dict, folder: str) -> int:
    """The resolution-asymmetry protocol (teacher at the database resolution, students at the query resolutions,
    four setups with query FLOPs): ``config["resolution_job"]`` is the job config of
    :func:`pml_extensions.utils.resolution_job.run_resolution_job`. Writes results.json, results.md and
    performance_vs_flops.png into the experiment folder."""
    from ..utils import resolution_job as job

    spec = config.get("resolution_job")
    if not isinstance(spec, dict):
        raise ConfigError("config_general: resolution_job must be a mapping (the job config)")
    try:
        result = job.run_resolution_job(spec)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"config_general: resolution_job: {type(e).__name__}: {e}") from e
    summary = job.summarize(result["rows"])
    table = job.markdown_table(summary)
    os.makedirs(folder, exist_ok=True)
    job.save_json({**result, "summary": summary}, os.path.join(folder, "results.json"))
    from ..utils.atomic_io import atomic_write_text

    atomic_write_text(os.path.join(folder, "results.md"), table + "\n")
    job.plot_performance_vs_flops(summary, os.path.join(folder, "performance_vs_flops.png"))
    print(table)
    print(f"results: {os.path.join(folder, 'results.json')}")
    return 0


def _main(argv: List[str]) -> int:
    from .config_loader import load_config, parse_command_line, split_selection

    config_arg = None
    if argv and not argv[0].startswith("--"):
        config_arg, argv = argv[0], argv[1:]
    cli = parse_command_line(argv)
    if "list" in cli:
        value = cli["list"]
        return _list(None if value is True else (config_arg or value))
    selection, rest = split_selection(cli)
    runner = {k: rest.pop(k) for k in RUNNER_KEYS if k in rest}
    config_arg = runner.get("config_root", config_arg)
    if config_arg is None:
        raise ConfigError(
            "command line: CONFIG: give a config folder or a shipped config name as the first argument"
        )
    root = find_config_root(str(config_arg))
    variant = runner.get("variant")
    if variant:
        selection = _variant_selection(root, str(variant), selection)
    name = runner.get("experiment_name") or (
        os.path.basename(os.path.normpath(str(config_arg))) + (f"_{variant}" if variant else "")
    )
    folder = os.path.join(str(runner.get("root_experiment_folder", "experiments")), str(name))

    from . import distributed as dist_utils

    dist_utils.init_from_env()
    if runner.get("report_only"):
        from .report import write_report

        print(write_report(folder))
        return 0
    show_progress = bool(runner.get("progress", False))
    config, sources = load_config(root, selection, rest)
    if not show_progress:
        _quiet_progress_bars()
    if config.get("protocol", "mlrc") == "resolution_distillation":
        return _run_resolution_distillation(config, folder)
    if config.get("protocol", "mlrc") != "mlrc":
        raise ConfigError(
            f"{sources.get('protocol', 'config_general')}: protocol must be 'mlrc' or 'resolution_distillation', "
            f"got {config['protocol']!r}"
        )
    from .mlrc import MLRCRunner

    results = MLRCRunner(config, folder, sources).run()
    if dist_utils.is_main():
        for key, metrics in results["test"].items():
            if key == "per_model":
                continue
            shown = ", ".join(f"{m}={v:.4f}" for m, v in metrics.items() if isinstance(v, float))
            print(f"test {key}: {shown}")
        print(
            f"results: {os.path.join(folder, 'results.json')}; report: {os.path.join(folder, 'report.html')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
