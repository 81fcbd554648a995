"""usage: python -m pml_extensions job [CONFIG] [RUN OPTIONS ...]

The main job: the `run` command on the shipped xml_glyphs config (protocol xml_vs_gap: HistogramPooling +
XMLWrapper against the GAP baseline, seeds 0 1 2, paired), writing runs/<experiment_name>/. It takes run's
options, e.g.

  python -m pml_extensions job --dataset openclipart
  python -m pml_extensions job xml_clipart_mobilenet --num_epochs 2 --iterations_per_epoch 20
  python -m pml_extensions job --seeds 0 1 --variants contrastive_xml contrastive_gap --device cpu --new

CONFIG is a flat config (config_<category>.yaml files; default xml_glyphs); --root_experiment_folder defaults to
runs. Progress bars show when stderr is a terminal. The job's older option spellings still work and are read as
run's, with one note each: --config X (CONFIG), --output (--root_experiment_folder), --epochs (--num_epochs),
--iterations (--iterations_per_epoch), --dataset-root (--dataset_root), --seed S (--seeds S).
Exit status: 0 done, 1 a file could not be written or read, 2 config error (one line on stderr), 130 / 143
interrupted (rerun the same command to resume).
"""

import sys
from typing import List, Optional

from ..runner.errors import ConfigError
from . import run

DEFAULT_CONFIG = "xml_glyphs"
DEFAULT_ROOT = "runs"
PROG = ("python", "-m", "pml_extensions", "job")
#: the job's older spellings -> run's (``None``: the positional CONFIG)
OLD_SPELLINGS = {
    "--config": None,
    "--output": "--root_experiment_folder",
    "--epochs": "--num_epochs",
    "--iterations": "--iterations_per_epoch",
    "--dataset-root": "--dataset_root",
    "--seed": "--seeds",
}


def run_argv(argv: List[str], notes=None) -> List[str]:
    """``job`` arguments as ``run`` arguments: CONFIG first (default ``xml_glyphs``), the older spellings renamed
    (one note each to ``notes``, default stderr), ``--root_experiment_folder runs`` unless given.

    Raises:
        ConfigError: a flag without its value, two CONFIGs, or ``--seed`` with ``--seeds``.

    Example::

        >>> run_argv(["--epochs", "1", "--seeds", "0", "1"], notes=lambda line: None)
        ['xml_glyphs', '--num_epochs', '1', '--seeds', '0', '1', '--root_experiment_folder', 'runs']
    """
    notes = notes or (lambda line: print(line, file=sys.stderr))
    config, out, i = None, [], 0
    if argv and not argv[0].startswith("--"):
        config, i = argv[0], 1
    flags = [a for a in argv if a.startswith("--")]
    if "--seed" in flags and "--seeds" in flags:
        raise ConfigError("command line: --seed and --seeds: give one of them")
    while i < len(argv):
        word = argv[i]
        if word in OLD_SPELLINGS:
            new = OLD_SPELLINGS[word]
            if new is None:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError(f"command line: {word}: needs a config name or folder")
                if config is not None:
                    raise ConfigError(f"command line: {word} {argv[i + 1]}: a second config (the first is {config})")
                config = argv[i + 1]
                notes(f"note: job {word} {config} is run's CONFIG argument: job {config}")
                i += 2
                continue
            notes(f"note: job {word} is read as {new} (the run command's spelling)")
            out.append(new)
        else:
            out.append(word)
        i += 1
    if "--root_experiment_folder" not in out:
        out += ["--root_experiment_folder", DEFAULT_ROOT]
    return [config or DEFAULT_CONFIG] + out


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0

    def job():
        args = run_argv(argv)
        _check_flat(args[0])
        if sys.stderr.isatty() and "--progress" not in args:  # a terminal: bars; a log file or a pipe: none
            args.append("--progress")
        return run._main(args, prog=PROG, announce=lambda config, folder: _announce(args[0], config, folder))

    return run.guarded(job)  # one line (and its exit status) for config errors, files and interrupts


def load_job_config(argv: List[str]):
    """``(config, sources)`` exactly as ``job argv`` would run them (nothing is trained or written).

    Raises:
        ConfigError: as ``main`` would report.
    """
    from ..runner.config.loader import find_config, load_config, parse_command_line, select_variants, split_selection

    args = run_argv(list(argv), notes=lambda line: None)
    _check_flat(args[0])
    cli = parse_command_line(args[1:])
    selection, rest = split_selection(cli)
    for key in run.RUNNER_KEYS:
        rest.pop(key, None)
    chosen = run._names(rest.get("variants"))
    if chosen is not None:
        rest.pop("variants")
    config, sources = load_config(find_config(args[0]), selection, rest, allow_search=True)
    return (select_variants(config, chosen) if chosen is not None else config), sources


def _check_flat(config_arg: str) -> None:
    from ..runner.config.loader import config_layout, find_config

    if config_layout(find_config(config_arg)) == "folders":
        raise ConfigError(
            f"job: {config_arg} is a powerful-benchmarker folder config; run it with "
            f"python -m pml_extensions run {config_arg}"
        )


def _announce(config_arg: str, config: dict, folder: str) -> None:
    from ..runner.protocols.xml_vs_gap.protocol import dataset_name

    print(f"pml_extensions job: config {config_arg}, dataset {dataset_name(config.get('dataset'))}, output {folder}")


if __name__ == "__main__":
    sys.exit(main())
