"""Command line: ``python -m pml_extensions <command> ...`` (also the ``pml-extensions`` console script).

Commands:
    job      the main XML job (HistogramPooling + XMLWrapper vs the GAP baseline) from a shipped or given config.
    run      run a powerful-benchmarker-style config folder (see ``pml_extensions.runner.cli``).
    explain  explain why two images are similar (see ``pml_extensions.explain.cli``).
"""

import importlib
import sys

COMMANDS = {
    "job": "pml_extensions.runner.protocols.xml_vs_gap",
    "run": "pml_extensions.runner.cli",
    "explain": "pml_extensions.explain.cli",
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
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
