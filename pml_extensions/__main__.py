"""``python -m pml_extensions {job,run,explain} ...``: the command line (:mod:`pml_extensions.cli`)."""

import sys

from pml_extensions.cli import main

if __name__ == "__main__":
    sys.exit(main())
