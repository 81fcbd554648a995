"""Copy the benchmark result tables into the README, so that no README number is typed by hand.

Each benchmark writes its numbers to ``benchmarks/results/NAME.json`` and the table rendered from them to
``benchmarks/results/NAME.md``. The README holds, for each table, a block::

    <!-- results:NAME -->
    ...the contents of benchmarks/results/NAME.md...
    <!-- /results:NAME -->

    python benchmarks/readme_tables.py           # rewrite every block from its results file
    python benchmarks/readme_tables.py --check   # exit 1 when a block differs from its file (used by the tests)

A block whose results file is missing is an error: a README table always has a file behind it.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
BLOCK = re.compile(r"(<!-- results:([A-Za-z0-9_.-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def render(text: str, results_dir: str = RESULTS) -> str:
    """Return ``text`` with every results block replaced by its file's contents.

    Raises:
        FileNotFoundError: a block names a results file that does not exist.
    """

    def _sub(match):
        path = os.path.join(results_dir, match.group(2) + ".md")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"README block 'results:{match.group(2)}' has no results file {path}")
        with open(path, encoding="utf-8") as f:
            body = f.read()
        if not body.endswith("\n"):
            body += "\n"
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(_sub, text)


def block_names(text: str) -> list:
    """Names of the results blocks in ``text``, in order."""
    return [m.group(2) for m in BLOCK.finditer(text)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README differs from the results")
    parser.add_argument("--readme", default=README)
    args = parser.parse_args(argv)
    with open(args.readme, encoding="utf-8") as f:
        text = f.read()
    new = render(text)
    if args.check:
        if new != text:
            print("README result tables differ from benchmarks/results/*.md: run python benchmarks/readme_tables.py")
            return 1
        return 0
    if new != text:
        from pml_extensions.utils.atomic_io import atomic_write_text

        atomic_write_text(args.readme, new)
    print(f"{len(block_names(text))} result blocks in {os.path.relpath(args.readme, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
