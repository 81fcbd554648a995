"""The main job's README table (``results:xml_vs_gap``): the job's own ``results.md`` (rendered again from its
``results.json`` by the protocol's :func:`~pml_extensions.runner.protocols.paired.protocol.markdown_parts`) and,
beside it, the paper's claim with the verdict of every XML-vs-GAP comparison.

The claim (XML, ICIP 2023: XML gives "consistent improvements" on unseen classes) concerns the comparisons whose
variant trains an XMLWrapper with a positive weight (a variant with an ``xml_loss`` curve in the results) against a
baseline without one (no ``xml`` counters in its units). Verdicts:
:func:`pml_extensions.runner.outputs.results.verdict`.

    python -m pml_extensions job --output runs --new            # the job (benchmarks/reproduce.py runs it)
    python benchmarks/xml_vs_gap.py --run-folder runs/xml_glyphs  # -> benchmarks/results/xml_vs_gap.json / .md
    python benchmarks/xml_vs_gap.py --from-json benchmarks/results/xml_vs_gap.json   # re-render the .md only
"""

import argparse
import json
import os
import shutil

from pml_extensions.runner.outputs.results import render_markdown, verdict
from pml_extensions.runner.protocols.paired.protocol import markdown_parts
from pml_extensions.runner.protocols.paired.unit import METRICS
from pml_extensions.utils.atomic_io import atomic_write_text

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CLAIM = (
    'Paper (XML, ICIP 2023): XML gives "consistent improvements" on unseen classes. Here, per XML-vs-GAP comparison:'
)


def xml_vs_gap_comparisons(results: dict) -> list:
    """The comparisons the paper's claim is about: a variant with a positive XML weight against one without XML."""
    with_xml = set(results.get("xml_loss_curves") or {})
    first = str(results["seeds"][0])
    without = {n for n, per in results["units"].items() if not (per.get(first) or {}).get("xml")}
    return [c for c in results["comparisons"] if c["variant"] in with_xml and c["baseline"] in without]


def markdown(results: dict) -> str:
    """The job's ``results.md`` followed by the paper's claim and a verdict line per XML-vs-GAP comparison."""
    header, footer = markdown_parts(results)
    md = render_markdown(results, list(METRICS), header)
    claims = [f"- {verdict(c)}" for c in xml_vs_gap_comparisons(results)]
    if claims:
        md += "\n" + CLAIM + "\n" + "\n".join(claims) + "\n"
    if footer:
        md += "\n" + footer.rstrip() + "\n"
    return md


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-folder", help="the job's experiment folder (results.json inside)")
    source.add_argument("--from-json", help="a results.json already copied (re-render the .md next to it)")
    p.add_argument("--out", default=RESULTS, help="where xml_vs_gap.json / .md go (with --run-folder)")
    args = p.parse_args(argv)
    if args.run_folder:
        os.makedirs(args.out, exist_ok=True)
        json_path = os.path.join(args.out, "xml_vs_gap.json")
        shutil.copyfile(os.path.join(args.run_folder, "results.json"), json_path)
    else:
        json_path = args.from_json
    with open(json_path, encoding="utf-8") as f:
        results = json.load(f)
    md = markdown(results)
    atomic_write_text(os.path.splitext(json_path)[0] + ".md", md)
    print(md)
    return 0


if __name__ == "__main__":
    main()
