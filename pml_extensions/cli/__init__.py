"""usage: python -m pml_extensions {job,run,explain} ...   (also the pml-extensions console script)

Commands:
    job      the main XML job: `run` on the shipped xml_glyphs config (HistogramPooling + XMLWrapper vs the GAP
             baseline), output under runs/; job --help for more.
    run      run a config with its protocol (run --list protocol lists them); run --help for more.
    explain  explain why two images are similar; explain --help for more.
"""

import importlib
import sys
import warnings
from typing import List, Optional

#: command -> module with ``main(argv) -> int`` (imported on first use: ``explain`` never loads the runner's
#: dependencies, ``run`` never loads matplotlib's image code)
COMMANDS = {name: f"pml_extensions.cli.{name}" for name in ("job", "run", "explain")}

#: the start of the warning that pytorch-metric-learning's ``BaseTrainer`` triggers at every run's first iteration
PML_LOSS_WARNING = "Converting a tensor with requires_grad=True to a scalar"


def main(argv: Optional[List[str]] = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to a command; returns the exit status (2: bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0
    module = importlib.import_module(COMMANDS[argv[0]])
    with warnings.catch_warnings():
        # pytorch-metric-learning's trainer formats its loss tensor into the progress bar; this torch warns about
        # that in three lines at the first iteration of every run. The loss is logged as a number either way.
        warnings.filterwarnings("ignore", message=PML_LOSS_WARNING, category=UserWarning)
        status = module.main(argv[1:]) or 0
    distributed = sys.modules.get("pml_extensions.runner.experiment.distributed")
    if status == 0 and distributed is not None:  # a run under torchrun: every rank reached the end; leave together
        distributed.shutdown()
    return status
