"""usage: python -m pml_extensions run CONFIG [--variant NAME] [--experiment_name NAME] [--dry-run] [--KEY VALUE ...]

Run a powerful-benchmarker-style config with its protocol (the config's `protocol:` key).

  python -m pml_extensions run CONFIG [--variant quick] [--experiment_name NAME] [--root_experiment_folder DIR]
      [--config_general [default, other]] ... [--key value | --key~OVERRIDE~ {...} | --key~APPLY~2 {...} ...]
  python -m pml_extensions run CONFIG ... --data_folder PATH   your own images: a folder of class folders or a
      CSV file (label, path, split columns; --columns label=category,path=image,split=subset maps yours); see
      docs/own_data.md
  python -m pml_extensions run CONFIG ... --dry-run     every check the run makes before training (the config, the
      images, the classes), then the merged config as YAML; trains nothing, writes nothing
  python -m pml_extensions run --list [ROLE | protocol]  the class names a config can use, or the protocols
  python -m pml_extensions run --reproduce RUN_FOLDER    rerun a finished experiment from its saved config
  python -m pml_extensions run --report_only RUN_FOLDER  write a run's report.html again from its files
  torchrun --nproc_per_node 2 -m pml_extensions run CONFIG ...   (gloo on CPU, nccl on GPU)

CONFIG is a config folder or the name of a shipped config (contrastive, contrastive_xml, proxy_anchor,
proxy_anchor_xml, template_block, explanation, xml_glyphs, distillation_glyphs); `run --list protocol` lists the
protocols.
--variant NAME merges NAME.yaml after default.yaml in every folder that has one (the shipped configs have quick:
embedded glyph data, minutes on 2 CPU cores). --config_<folder> [a, b] chooses the files of one folder.
Every other --key value is merged into the config with powerful-benchmarker's syntax; a key that no config
file defines and the protocol does not read is an error naming the nearest known key.
--variants a b keeps only these entries of a flat config's `variants` (and the comparisons between them).
Keys marked ~BAYESIAN~ / ~LOG_BAYESIAN~ / ~INT_BAYESIAN~ run an Optuna search (pip install optuna;
--bayes_opt_iters N trials, stored in the experiment folder, resumable).
--progress shows progress bars. The experiment goes to <root_experiment_folder>/<experiment_name> (default
experiments/<the config's experiment_name, or config>[_<variant>]); running the same command again resumes it; a
changed config stops with the differing keys: --new starts afresh, --resume-anyway continues deliberately.
Checks before training (one line each): every image decodes (--skip_bad_images true leaves bad files out), enough
classes for the split and the sampler, image channels that fit the trunk. Ctrl-C or SIGTERM stops a run with one line
(exit 130 / 143); rerunning the same command resumes it.
Exit status: 0 done, 1 a file could not be written or read (one line naming it) or a search stopped by its
failure rule (bayes_opt_max_failures_in_a_row), 2 config error (one line on stderr), 130 / 143 interrupted by
SIGINT / SIGTERM.
"""

import glob
import os
import signal
import sys
from typing import Callable, List, Optional, Sequence, Tuple

from ..runner.config import loader  # torch and the rest load when a run starts (_main)
from ..runner.errors import ConfigError

PROG = ("python", "-m", "pml_extensions", "run")
#: the command line's own options (not config keys)
RUNNER_KEYS = (
    "experiment_name root_experiment_folder variant config_root list report_only progress dry-run dry_run new "
    "resume-anyway resume_anyway reproduce data_folder columns"
).split()


def _split(argv: List[str]) -> Tuple[Optional[str], List[str]]:
    """``(CONFIG, the options)``: CONFIG is the first argument unless it is an option."""
    return (argv[0], argv[1:]) if argv and not argv[0].startswith("--") else (None, list(argv))


def _variants(root: str) -> str:
    """The variant names of a folder config (its folders' files besides ``default.yaml``), for a message."""
    names = {
        os.path.basename(p)[:-5] for f in loader.CONFIG_FOLDERS for p in glob.glob(os.path.join(root, f, "*.yaml"))
    }
    return ", ".join(sorted(names - {"default"})) or "-"


def _variant_selection(root: str, variant, selection: dict) -> dict:
    """``selection`` with ``[default, variant]`` for every config folder that has ``<variant>.yaml``."""
    display_path = loader.display_path
    if not isinstance(variant, str) or not variant:
        raise ConfigError(f"command line: --variant: needs a name; {display_path(root)} has: {_variants(root)}")
    found = [
        folder for folder in loader.CONFIG_FOLDERS if os.path.isfile(os.path.join(root, folder, f"{variant}.yaml"))
    ]
    if not found and loader.config_layout(root) == "flat":  # a flat config's variants are entries of its `variants` key
        raise ConfigError(
            f"command line: --variant {variant}: {display_path(root)} is a flat config, without variant files; "
            "--variants NAME ... keeps entries of its `variants` key"
        )
    if not found:
        raise ConfigError(
            f"command line: --variant {variant}: no such variant; {display_path(root)} has: {_variants(root)}"
        )
    return {**{folder: ["default", variant] for folder in found}, **selection}  # a --config_<folder> choice wins


def quiet_progress_bars():
    """Turn off the tqdm bars PML's trainers and testers draw with no switch of their own."""
    from functools import partialmethod

    import tqdm

    if not getattr(tqdm.tqdm, "_pml_extensions_quiet", False):
        tqdm.tqdm.__init__ = partialmethod(tqdm.tqdm.__init__, disable=True)
        tqdm.tqdm._pml_extensions_quiet = True


def _list(role: Optional[str]) -> int:
    """Print every class a config can name, per role, or the protocols."""
    from ..runner.config.registry import ROLES, names_for_role

    if role == "protocol":
        from ..runner.protocols import descriptions

        print("protocols (the config's `protocol:` key; a plugin outside the package by its dotted path):")
        for name, text in descriptions().items():
            print(f"  {name}: {text}")
        return 0
    if role is not None and role not in ROLES:
        raise ConfigError(f"command line: --list: unknown role {role!r}; choose from {', '.join(ROLES)} or protocol")
    print("Classes a config can name, by role: pml_extensions (and registered) classes, then the stock classes of")
    print("pytorch-metric-learning, torch and torchvision, grouped by module. `--list protocol` lists the protocols.")
    print(
        "Trunks may also name model functions: torchvision.models' (resnet50, mobilenet_v2, ...) and ours "
        "(mobilenet_v2_features, ...)."
    )
    for r in [role] if role else ROLES:
        groups = {}
        for name, module in names_for_role(r).items():
            group = "pml_extensions" if module.startswith("pml_extensions") else ".".join(module.split(".")[:2])
            groups.setdefault(group, []).append(name)
        print(f"{r}:")
        for group in sorted(groups, key=lambda g: (not g.startswith("pml_extensions"), g)):
            print(f"  {group}: {', '.join(sorted(groups[group]))}")
    return 0


def guarded(call: Callable[[], int], what: str = "--root_experiment_folder") -> int:
    """``call()``'s exit status, or one line on stderr and the status for what stopped it: an interrupt (``128 +
    signal``: 130 for Ctrl-C, 143 for SIGTERM; where it stood and that rerunning resumes), a file that cannot be
    written or read (1; the path), a config error (2). Under torchrun only rank 0 prints."""
    from ..runner.errors import OUTPUT_ERRNOS, ConfigProblems, OutputError, first_line

    def say(line: str) -> None:
        if os.environ.get("RANK", "0") == "0":
            print(line, file=sys.stderr)

    try:
        return call()
    except KeyboardInterrupt as e:
        from ..runner.errors import position

        where = position()
        stood = "before the first epoch" if where == "the start" else f"at {where}"
        say(f"interrupted {stood}; rerun the same command to resume")
        return 128 + getattr(e, "signal_number", signal.SIGINT)
    except OutputError as e:
        say(f"error: {first_line(e)}")
        return 1
    except ConfigError as e:
        say(f"config error: {e if isinstance(e, ConfigProblems) else first_line(e)}")
        return 2
    except OSError as e:
        if e.errno not in OUTPUT_ERRNOS:
            raise
        say(f"error: {OutputError.writing(e.filename or '(output)', e, what)}")
        return 1


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    return guarded(lambda: _main(argv))


def _print_results(results: dict, folder: str, search: bool) -> None:
    best = results.get("best") if search else None
    if best:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in best["params"].items())
        print(f"best of {results['n_trials']} trials: trial {best['number']} (objective {best['value']:.4f}): {shown}")
    test = (best or results).get("test")  # a search: its best trial's
    for key, metrics in (test if isinstance(test, dict) else {}).items():
        if isinstance(metrics, dict):
            shown = ", ".join(f"{m}={v:.4f}" for m, v in metrics.items() if isinstance(v, float))
            print(f"test {key}: {shown}")
    main_file = "search.json" if search else "results.json"
    print(f"results: {os.path.join(folder, main_file)}; report: {os.path.join(folder, 'report.html')}")


def _experiment_folder(options: dict, config_arg, config_name: Optional[str] = None) -> str:
    """``<root_experiment_folder>/<experiment_name>`` (the option's name, else the config's, else its folder's)."""
    variant = options.get("variant")
    default_name = os.path.basename(os.path.normpath(str(config_arg))) + (f"_{variant}" if variant else "")
    name = options.get("experiment_name") or config_name or default_name
    return os.path.join(str(options.get("root_experiment_folder", "experiments")), str(name))


def load(argv: List[str]):
    """``(config, sources, folder, runner options, config root)`` of ``run argv`` (``argv[0]``: CONFIG), merged and
    checked against its protocol (:func:`pml_extensions.runner.protocols.load_config`), nothing trained or written;
    ConfigError: one line naming the file (or the command line) and the key."""
    from ..runner.protocols import load_config

    config_arg, argv = _split(argv)
    selection, rest = loader.split_selection(loader.parse_command_line(argv))
    runner = {k.replace("-", "_"): rest.pop(k) for k in RUNNER_KEYS if k in rest}
    chosen = _names(rest.pop("variants")) if _names(rest.get("variants")) is not None else None
    config_arg = runner.get("config_root", config_arg)
    if config_arg is None:
        raise ConfigError("command line: CONFIG: give a config folder or a shipped config name as the first argument")
    root = loader.find_config(str(config_arg))
    if "variant" in runner:
        selection = _variant_selection(root, runner["variant"], selection)
    config, sources = load_config(
        root, selection, rest, allow_search=True, data_folder=runner.get("data_folder"), columns=runner.get("columns")
    )
    folder = _experiment_folder(runner, config_arg, config.get("experiment_name"))
    if chosen is not None:
        config = loader.select_variants(config, chosen)
    return config, sources, folder, runner, root


def _main(argv: List[str], prog: Sequence[str] = PROG, announce: Optional[Callable[..., None]] = None) -> int:
    """``run`` (and ``job``, which calls it with its own ``prog`` and an ``announce(config, folder)`` line)."""
    config_arg, options = _split(argv)
    cli = loader.parse_command_line(options)
    if "list" in cli:
        value = cli["list"]
        return _list(None if value is True and config_arg is None else (config_arg if value is True else value))
    if not cli.get("progress", False):
        quiet_progress_bars()
    if "reproduce" in cli:
        from ..runner.protocols import reproduce

        if not isinstance(cli["reproduce"], str):
            raise ConfigError("command line: --reproduce: needs the folder of a finished run")
        return reproduce.main(cli["reproduce"], command=list(prog) + argv)
    if cli.get("report_only"):
        from ..runner.outputs.report import write_report

        value = cli["report_only"]  # a run's folder, or true: the folder CONFIG and its options run in
        folder = value if isinstance(value, str) else load(argv)[2]
        if not os.path.isdir(folder):
            raise ConfigError(
                f"command line: --report_only: {folder}: no such experiment folder (give a run's folder, or the "
                "CONFIG and options of a run)"
            )
        print(write_report(folder))
        return 0
    config, sources, folder, runner, root = load(argv)
    search = bool(loader.find_search_markers(config))
    if runner.get("dry_run"):
        import yaml

        if not search:  # the checks of the data the run makes before any work
            from ..runner.protocols import protocol_of

            notes = lambda msg="", *a, **k: str(msg).startswith("note:") and print(msg)  # noqa: E731
            protocol_of(config, sources)(config, folder, sources, notes).preflight()

        print(f"# {loader.display_path(root)} merged with the command line and checked (not run)")
        print(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), end="")
        return 0
    if runner.get("new") and runner.get("resume_anyway"):
        raise ConfigError("command line: --new and --resume-anyway exclude each other")
    from ..runner.errors import raise_on_signals
    from ..runner.experiment import distributed as dist_utils  # the run starts: torch and the rest load here

    dist_utils.init_from_env()
    on_change = "new" if runner.get("new") else ("resume" if runner.get("resume_anyway") else "stop")
    if announce is not None and dist_utils.is_main():
        announce(config, folder)
    if search:
        from ..runner.protocols.search import run_search as run_experiment
    else:
        from ..runner.protocols import run_protocol as run_experiment
    with raise_on_signals():  # SIGINT / SIGTERM: errors.Interrupted, reported by guarded() in one line
        results = run_experiment(config, folder, sources, on_change=on_change, command=list(prog) + argv)
    if dist_utils.is_main():
        _print_results(results, folder, search)
    return 1 if search and results.get("stopped") else 0


def _names(value) -> Optional[List[str]]:
    """``--variants a b`` (``"a b"``) or ``[a, b]`` as names; None for anything else (a mapping merges as usual)."""
    if isinstance(value, str):
        return value.replace(",", " ").split()
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return None


if __name__ == "__main__":
    sys.exit(main())
