"""Copy the benchmark result tables into the README (and the docs pages), and write the README's one-line headline
of each method from the results files, so that no README number is typed by hand.

Each benchmark writes its numbers to ``benchmarks/results/NAME.json`` and the table rendered from them to
``benchmarks/results/NAME.md``. A page holds, for each table, a block::

    <!-- results:NAME -->
    ...the contents of benchmarks/results/NAME.md...
    <!-- /results:NAME -->

and, for each method's headline, a block whose one line is written from :data:`HEADLINES` ``[KEY]``::

    <!-- headline:KEY -->
    **At our scale** (paper: CLAIM): WHAT, n seeds: +d [low, high] UNIT, δ = D: VERDICT; ... [All numbers](...).
    <!-- /headline:KEY -->

A headline reads paired comparisons (a mean difference and its 95 % t interval, with the bootstrap interval and the
Holm-adjusted p-value where the benchmark stored them) out of ``benchmarks/results/NAME.json`` and words each with the
runner's one verdict vocabulary (:func:`pml_extensions.utils.verdicts.verdict_word`): "shown", "no effect of
practical size", "contradicted" or "inconclusive (n seeds)", read against the smallest effect of interest δ that each
:class:`Evidence` states with its claim's direction (the benchmark's own δ: a file that stores one must agree). An
inconclusive interval adds the largest effect it leaves possible, "effect within ±X UNIT"
(:func:`~pml_extensions.utils.verdicts.effect_bound`). Adding a headline for a new results file is one entry
of :data:`HEADLINES` (or one more :class:`Evidence` in an entry) and the marker pair in the README; e.g. a comparison
of the runner's ``results.json`` layout with a δ of 1 MAP@R point (MAP@R stored as a fraction)::

    Evidence.paired("xml_vs_gap", "contrastive_xml", "contrastive_gap", "main job", smallest_effect=0.01, scale=100)

Commands::

    python benchmarks/readme_tables.py           # rewrite every block of the README from its results file
    python benchmarks/readme_tables.py --check   # exit 1 when a block differs from its file (used by the tests)

A block whose results file is missing, or a headline whose comparison is not in its file, is an error: a README
number always has a file behind it.
"""

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
BLOCK = re.compile(r"(<!-- results:([A-Za-z0-9_.-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)
HEADLINE = re.compile(r"(<!-- headline:([A-Za-z0-9_.-]+) -->\n)(.*?)(<!-- /headline:\2 -->)", re.S)
#: ``<!-- summary:NAME -->``: the first paragraph of ``benchmarks/results/NAME.md`` (a benchmark's opening sentence)
SUMMARY = re.compile(r"(<!-- summary:([A-Za-z0-9_.-]+) -->\n)(.*?)(<!-- /summary:\2 -->)", re.S)
#: the claim directions of :data:`pml_extensions.utils.verdicts.CLAIMS` (written here: the docs build
#: renders this module's blocks without the package installed)
CLAIMS = ("greater", "less", "on_par")


@dataclass(frozen=True)
class Evidence:
    """One paired comparison of a results file, as a headline words it.

    Attributes:
        results: ``NAME`` of ``benchmarks/results/NAME.json``.
        where: the path to the comparison in that JSON: dict keys (str), list indices (int), or a dict of fields that
            picks the one list item whose fields have these values (``{"variant": "xml", "baseline": "gap"}``). The
            comparison holds ``mean_difference`` (or ``mean``) and ``ci95`` (``[low, high]``, ``None`` for one seed),
            and ``n`` (or ``differences`` / ``seeds``) when the number of seeds is to be shown.
        label: what is compared, in words (``"XML − GAP, main job"``).
        smallest_effect: δ of the claim, in the comparison's units as stored (0.01: 1 point of a fraction); required.
            Where the comparison stores its own ``smallest_effect`` the two must be equal.
        claim: the paper's claim about ``variant − baseline`` as shown (after ``flip``): ``"greater"``, ``"less"`` or
            ``"on_par"`` (:func:`~pml_extensions.utils.verdicts.verdict_word`); a comparison's own ``claim``
            must agree (mirrored by ``flip``).
        scale: the values and δ are multiplied by it (100: a fraction shown in points).
        digits: decimals shown.
        unit: written after the interval (``"MAP@R points"``).
        flip: show ``baseline − variant`` (the difference and the interval negated).
    """

    results: str
    where: Tuple[Any, ...]
    label: str
    smallest_effect: Optional[float] = None
    claim: str = "greater"
    scale: float = 1.0
    digits: int = 2
    unit: str = ""
    flip: bool = False

    def __post_init__(self):
        delta = self.smallest_effect
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < float("inf"):
            raise ValueError(f"Evidence {self.label!r}: smallest_effect must be a positive number, got {delta!r}")
        if self.claim not in CLAIMS:  # results.CLAIMS (tests/test_readme_tables.py: equal)
            raise ValueError(f"Evidence {self.label!r}: claim must be one of {', '.join(CLAIMS)}, got {self.claim!r}")

    @classmethod
    def paired(cls, results: str, variant: str, baseline: str, label: str, *, metric=None, under=(), **kwargs):
        """The comparison ``variant − baseline`` (of ``metric`` when given) in the runner's ``results.json`` layout
        (:mod:`pml_extensions.runner.outputs.results`: a ``comparisons`` list, under the keys ``under``).

        Example::

            >>> Evidence.paired("xml_vs_gap", "contrastive_xml", "contrastive_gap", "main", smallest_effect=0.01).where
            ('comparisons', {'variant': 'contrastive_xml', 'baseline': 'contrastive_gap'})
        """
        match = {"variant": variant, "baseline": baseline, **({"metric": metric} if metric else {})}
        return cls(results, (*tuple(under), "comparisons", match), label, **kwargs)


@dataclass(frozen=True)
class Headline:
    """A method's headline: the paper's claim and the comparisons that test it at our scale, best evidence first.

    Attributes:
        paper: the claim, in the paper's terms (``'XML gives "consistent improvements" on unseen classes'``).
        evidence: the comparisons (:class:`Evidence`), in the order they are written.
        more: a link to where every number of these benchmarks is shown.
    """

    paper: str
    evidence: Tuple[Evidence, ...]
    more: str = ""


def _xml_cached(dataset: str, loss: str, label: str, setting: str = "frozen") -> Evidence:
    """XML − GAP of one row of ``benchmarks/results/xml_trained.json`` (``setting="trained"``: features.14-18 trained
    on cached features.13 maps, where XML's term shapes the features) or ``xml_cached.json`` (``"frozen"``: a head on
    frozen features.18), MAP@R points, δ = 1 point: the benchmark's ``SMALLEST_EFFECT``."""
    name, label_of_setting = {
        "trained": ("xml_trained", "features.14-18 trained"),
        "frozen": ("xml_cached", "frozen to features.18"),
    }[setting]
    row = {"dataset": dataset, "setting": label_of_setting, "loss": loss}
    return Evidence(name, ("rows", row, "difference"), label, smallest_effect=1.0, unit="MAP@R points")


def _template_block(data: str, label: str) -> Evidence:
    """block − baseline trained from scratch (``benchmarks/results/template_block.json``'s claims, accuracy points,
    δ = 0.5 points: the benchmark's ``SMALLEST_EFFECT``)."""
    where = ("claims", "comparisons", {"variant": "block", "baseline": "baseline", "data": data})
    return Evidence("template_block", where, label, smallest_effect=0.5, unit="accuracy points")


def _localization(method: str, baseline: str, label: str) -> Evidence:
    """``method`` − ``baseline`` in the localisation claims (``benchmarks/results/localization.json``), accuracy at
    the threshold chosen on held-out composites, δ = 5 points: the benchmark's smallest effect."""
    return Evidence.paired(
        "localization",
        method,
        baseline,
        label,
        metric="held_out_accuracy",
        under=("claims",),
        smallest_effect=5.0,
        digits=1,
        unit="accuracy points",
    )


#: the README's headline per method: ``<!-- headline:KEY -->`` is written from ``HEADLINES[KEY]``; each δ is the one
#: its benchmark states beside the claim (the evidence guide's: 1 MAP@R point for retrieval, 0.5 accuracy points for
#: the template block; 5 localisation points for the explanation maps). The main job (``xml_vs_gap``) is a smoke test
#: and has no headline.
HEADLINES: Dict[str, Headline] = {
    "xml": Headline(
        'XML gives "consistent improvements" on unseen classes',
        (
            _xml_cached(
                "Open Clip Art",
                "contrastive",
                "XML − GAP with ImageNet MobileNetV2's last stage trained (features.14-18, 160 px), Open Clip Art, "
                "contrastive",
                "trained",
            ),
            _xml_cached("Open Clip Art", "ProxyAnchor", "the same with ProxyAnchor", "trained"),
            _xml_cached("glyphs", "contrastive", "last stage trained, glyphs, contrastive", "trained"),
            _xml_cached("glyphs", "ProxyAnchor", "last stage trained, glyphs, ProxyAnchor", "trained"),
            _xml_cached("Open Clip Art", "contrastive", "a head on frozen features (the second setting), contrastive"),
            _xml_cached("glyphs", "ProxyAnchor", "frozen, glyphs, ProxyAnchor"),
        ),
        "docs/methods/xml.md#evidence-at-our-scale",
    ),
    "template_block": Headline(
        "the block improves a ResNet's classification accuracy (Table 1)",
        (
            Evidence(
                "template_block_cached",
                ("tasks", "classification", "claims", {"variant": "block", "baseline": "baseline"}, "difference"),
                "block (inserted as identity) − plain last stage, pretrained MobileNetV2 on Open Clip Art (cached "
                "features)",
                smallest_effect=0.5,
                unit="accuracy points",
            ),
            Evidence(
                "template_block_cached",
                ("tasks", "dml", "claims", {"variant": "block", "baseline": "baseline"}, "difference"),
                "the same for unseen-class retrieval (DML)",
                smallest_effect=1.0,
                unit="MAP@R points",
            ),
            Evidence(
                "template_block_converged",
                ("claims", "comparisons", {"variant": "block", "baseline": "baseline"}),
                "from scratch, trained to convergence (2400 iterations): block − baseline on Fashion-MNIST",
                smallest_effect=0.5,
                unit="accuracy points",
            ),
            _template_block("Fashion-MNIST", "from scratch, 500 iterations: block − baseline on Fashion-MNIST"),
            _template_block("glyphs", "on glyphs"),
        ),
        "docs/methods/template_matching.md#evidence-at-our-scale",
    ),
    "resolution_distillation": Headline(
        "the distilled student's small queries beat the teacher's own small queries (Table 2)",
        (
            Evidence.paired(
                "resolution_distillation_off_floor",
                "glyphs/48px/teacher_student_asymmetric",
                "glyphs/48px/teacher_asymmetric",
                "distilled − naive asymmetric, 48 px queries against a 64 px glyph database (the naive baseline off "
                "the floor)",
                under=("claims",),
                smallest_effect=0.01,
                scale=100,
                unit="MAP@R points",
            ),
            Evidence.paired(
                "resolution_distillation",
                "glyphs/24px/teacher_student_asymmetric",
                "glyphs/24px/teacher_asymmetric",
                "24 px queries against a 48 px database (the naive baseline near the floor)",
                under=("claims",),
                smallest_effect=0.01,
                scale=100,
                unit="MAP@R points",
            ),
            Evidence.paired(
                "resolution_distillation",
                "glyphs/32px/teacher_student_asymmetric",
                "glyphs/32px/teacher_asymmetric",
                "32 px queries",
                under=("claims",),
                smallest_effect=0.01,
                scale=100,
                unit="MAP@R points",
            ),
        ),
        "docs/methods/resolution_distillation.md#evidence-at-our-scale",
    ),
    "explanation": Headline(
        "the decomposition localises objects better than Grad-CAM and Grad-CAM without normalisation (Table II)",
        (
            _localization(
                "Decomposition [ReLU]",
                "Grad-CAM [ReLU]",
                "Decomposition − Grad-CAM, Open Clip Art composites, maps with ReLU, thresholds chosen on held-out "
                "composites",
            ),
            _localization("Decomposition [ReLU]", "Grad-CAM (no norm) [ReLU]", "Decomposition − Grad-CAM (no norm)"),
            _localization(
                "Decomposition [signed]",
                "centre box",
                "Decomposition (signed, the paper's map) − a centre box that ignores the image",
            ),
        ),
        "docs/methods/explanation.md#evidence-at-our-scale",
    ),
}


def _read(path: str, what: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"README block '{what}' has no results file {path}")
    with open(path, encoding="utf-8") as f:
        return f.read()


def find(data: Any, where: Tuple[Any, ...], source: str = "the results") -> Any:
    """The item of ``data`` at the path ``where`` (see :class:`Evidence`).

    Raises:
        KeyError: a step of the path is not there, or a field dict matches no list item or several.

    Example::

        >>> find({"c": [{"v": "a", "d": 1}, {"v": "b", "d": 2}]}, ("c", {"v": "b"}, "d"))
        2
    """
    item = data
    for step in where:
        if isinstance(step, Mapping):
            found = [x for x in item if isinstance(x, Mapping) and all(x.get(k) == v for k, v in step.items())]
            if len(found) != 1:
                raise KeyError(f"{source}: {len(found)} items match {dict(step)} (expected one)")
            item = found[0]
        else:
            try:
                item = item[step]
            except (KeyError, IndexError, TypeError):
                raise KeyError(f"{source}: no {step!r} at {list(where)}") from None
    return item


#: the claim an Evidence shows after ``flip``, from the comparison's own
_MIRROR = {"greater": "less", "less": "greater", "on_par": "on_par"}


def shown_comparison(comparison: Mapping, evidence: Evidence, source: str = "the results") -> dict:
    """The comparison as the headline shows it: ``mean_difference`` (or ``mean``), and with ``flip`` the difference,
    its intervals and per-seed differences negated (p-values do not change).

    Raises:
        ValueError: the comparison stores a ``smallest_effect`` or a ``claim`` other than the Evidence's.
    """
    c = dict(comparison)
    stored, delta = c.get("smallest_effect"), evidence.smallest_effect
    if stored is not None and abs(stored - delta) > 1e-12 * max(1.0, abs(delta)):
        raise ValueError(f"{source}: {evidence.label!r} states δ = {delta!r}, its comparison was read with {stored!r}")
    if c.get("claim") is not None and (_MIRROR[c["claim"]] if evidence.flip else c["claim"]) != evidence.claim:
        raise ValueError(f"{source}: {evidence.label!r} claims {evidence.claim!r}, its comparison {c['claim']!r}")
    c["mean_difference"] = c["mean_difference"] if "mean_difference" in c else c["mean"]
    if evidence.flip:
        c["mean_difference"] = -c["mean_difference"]
        for key in ("ci95", "bootstrap_ci95"):
            if c.get(key) is not None:
                c[key] = [-c[key][1], -c[key][0]]
        if c.get("differences"):
            c["differences"] = [-d for d in c["differences"]]
    return c


def evidence_text(evidence: Evidence, results_dir: str = RESULTS) -> str:
    """``"label, n seeds: +d [low, high] unit, δ = D: verdict"`` for one comparison (see :class:`Evidence`), the verdict
    :func:`~pml_extensions.utils.verdicts.verdict_word` of the Evidence's claim and δ with the comparison's
    own Holm-adjusted p-value and intervals where it stores them. An inconclusive verdict says why: an interval that
    contains 0 adds the largest effect it leaves possible, ``", effect within ±X unit"``
    (:func:`~pml_extensions.utils.verdicts.effect_bound`); one that excludes 0 its Holm-adjusted p-value,
    ``", Holm-adjusted p P"`` (≥ 0.05).

    Raises:
        FileNotFoundError: the results file does not exist.
        KeyError: the comparison is not in it.
        ValueError: the comparison was read with another δ or claim (:func:`shown_comparison`).
    """
    from pml_extensions.utils.verdicts import VERDICTS, effect_bound, format_difference, verdict_word

    path = os.path.join(results_dir, evidence.results + ".json")
    comparison = find(json.loads(_read(path, f"headline from {evidence.results}")), evidence.where, path)
    shown = shown_comparison(comparison, evidence, path)
    n = shown.get("n") or len(shown.get("differences") or shown.get("seeds") or ())
    word = verdict_word(shown, evidence.claim, evidence.smallest_effect)
    seeds = f", {n} seeds" if n else ""
    unit = f" {evidence.unit}" if evidence.unit else ""
    bound = effect_bound(shown, evidence.scale)
    if word.startswith(VERDICTS[3]) and bound is not None:
        ends = [end for key in ("ci95", "bootstrap_ci95") if shown.get(key) is not None for end in shown[key]]
        if min(ends) <= 0 <= max(ends) or shown.get("p_holm") is None:
            word += f", effect within ±{bound:.{evidence.digits}f}{unit}"
        else:
            word += f", Holm-adjusted p {shown['p_holm']:.2g}"
    delta = f"δ = {evidence.scale * evidence.smallest_effect:g}"
    diff = format_difference(shown, evidence.digits, evidence.scale)
    return f"{evidence.label}{seeds}: {diff}{unit}, {delta}: {word}"


def headline_line(headline: Headline, results_dir: str = RESULTS) -> str:
    """The one line of a headline block (without its newline)."""
    parts = "; ".join(evidence_text(e, results_dir) for e in headline.evidence)
    more = f" [All numbers]({headline.more})." if headline.more else ""
    return f"**At our scale** (paper: {headline.paper}): {parts}.{more}"


def render(
    text: str,
    results_dir: str = RESULTS,
    headlines: Optional[Mapping[str, Headline]] = None,
    keep_headlines: bool = False,
) -> str:
    """Return ``text`` with every results block replaced by its file's contents, every headline block by its
    line from ``headlines`` (default :data:`HEADLINES`) and every summary block by the first paragraph of its file.
    ``keep_headlines`` leaves the headline blocks as written (the docs build: the committed lines, which
    ``--check`` compares with the results files, need the package's statistics to recompute).

    Raises:
        FileNotFoundError: a block names a results file that does not exist.
        KeyError: a headline block names no entry of ``headlines``, or its comparison is not in its file.
    """
    headlines = HEADLINES if headlines is None else headlines

    def _table(match):
        body = _read(os.path.join(results_dir, match.group(2) + ".md"), f"results:{match.group(2)}")
        if not body.endswith("\n"):
            body += "\n"
        return match.group(1) + body + match.group(4)

    def _headline(match):
        name = match.group(2)
        if name not in headlines:
            raise KeyError(f"README block 'headline:{name}' has no entry in HEADLINES ({', '.join(headlines)})")
        return match.group(1) + headline_line(headlines[name], results_dir) + "\n" + match.group(4)

    def _summary(match):
        body = _read(os.path.join(results_dir, match.group(2) + ".md"), f"summary:{match.group(2)}")
        return match.group(1) + body.strip().split("\n\n")[0].strip() + "\n" + match.group(4)

    text = BLOCK.sub(_table, text)
    return SUMMARY.sub(_summary, text if keep_headlines else HEADLINE.sub(_headline, text))


def block_names(text: str) -> list:
    """Names of the results blocks in ``text``, in order."""
    return [m.group(2) for m in BLOCK.finditer(text)]


def headline_names(text: str) -> list:
    """Keys of the headline blocks in ``text``, in order."""
    return [m.group(2) for m in HEADLINE.finditer(text)]


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
            print("README tables or headlines differ from benchmarks/results/: run python benchmarks/readme_tables.py")
            return 1
        return 0
    if new != text:
        from pml_extensions.utils.atomic_io import atomic_write_text

        atomic_write_text(args.readme, new)
    print(
        f"{len(block_names(text))} result blocks and {len(headline_names(text))} headlines in "
        f"{os.path.relpath(args.readme, ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
