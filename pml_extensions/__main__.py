"""usage: python -m pml_extensions {job,run,explain} ...   (also the pml-extensions console script)

Commands:
    job      the main XML job: the xml_vs_gap protocol (HistogramPooling + XMLWrapper vs the GAP baseline)
             from a shipped or given flat config; same output folder and files as before.
    run      run a config with its protocol (mlrc, xml_vs_gap, resolution_distillation); run --help for more.
    explain  explain why two images are similar; explain --help for more.
"""

import importlib
import sys

COMMANDS = {
    "job": "pml_extensions.runner.protocols.xml_vs_gap.protocol",
    "run": "pml_extensions.cli.run",
    "explain": "pml_extensions.cli.explain",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0
    module = importlib.import_module(COMMANDS[argv[0]])
    status = module.main(argv[1:]) or 0
    if status == 0:  # under torchrun: every rank reached the end; leave the process group together
        from pml_extensions.runner.experiment.distributed import shutdown

        shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
