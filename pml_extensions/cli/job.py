"""usage: python -m pml_extensions job [CONFIG] [RUN OPTIONS ...]

The main job: the `run` command on the shipped xml_glyphs config (HistogramPooling + XMLWrapper against the GAP
baseline, seeds 0 1 2 shared by every variant), writing runs/<experiment_name>/. It takes run's options, e.g.

  python -m pml_extensions job --dataset openclipart
  python -m pml_extensions job --num_epochs 2 --iterations_per_epoch 20
  python -m pml_extensions job --seeds 0 1 --variants contrastive_xml contrastive_gap --device cpu --new

CONFIG is a flat config (config_<category>.yaml files; default xml_glyphs); --root_experiment_folder defaults to
runs. Progress bars show when stderr is a terminal.
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


def run_argv(argv: List[str]) -> List[str]:
    """``job`` arguments as ``run`` arguments: CONFIG first (default ``xml_glyphs``), ``--root_experiment_folder
    runs`` unless given.

    Example::

        >>> run_argv(["--num_epochs", "1", "--seeds", "0", "1"])
        ['xml_glyphs', '--num_epochs', '1', '--seeds', '0', '1', '--root_experiment_folder', 'runs']
    """
    config, rest = run._split(argv)
    if "--root_experiment_folder" not in rest:
        rest += ["--root_experiment_folder", DEFAULT_ROOT]
    return [DEFAULT_CONFIG if config is None else config] + rest


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0

    def job():
        args = _flat_run_argv(argv)
        if sys.stderr.isatty() and "--progress" not in args:  # a terminal: bars; a log file or a pipe: none
            args.append("--progress")
        return run._main(args, prog=PROG, announce=announce)

    def announce(config: dict, folder: str) -> None:
        dataset = config.get("dataset")
        name = dataset.get("name", next(iter(dataset), None)) if isinstance(dataset, dict) else dataset
        print(f"pml_extensions job: config {run_argv(argv)[0]}, dataset {name}, output {folder}")

    return run.guarded(job)  # one line (and its exit status) for config errors, files and interrupts


def load_job_config(argv: List[str]):
    """``(config, sources)`` exactly as ``job argv`` would run them (nothing is trained or written; ConfigError)."""
    return run.load(_flat_run_argv(list(argv)))[:2]


def _flat_run_argv(argv: List[str]) -> List[str]:
    """:func:`run_argv`, refused for a folder config (``job`` runs flat configs)."""
    args = run_argv(argv)
    if run.loader.config_layout(run.loader.find_config(args[0])) == "folders":
        raise ConfigError(
            f"job: {args[0]} is a powerful-benchmarker folder config; run it with "
            f"python -m pml_extensions run {args[0]}"
        )
    return args


if __name__ == "__main__":
    sys.exit(main())
