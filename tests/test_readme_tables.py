"""Every README results block equals the table its benchmark wrote, and every headline line equals what its results
files say (no typed numbers)."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module():
    spec = importlib.util.spec_from_file_location("readme_tables", os.path.join(ROOT, "benchmarks", "readme_tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_blocks_match_results_files():
    mod = _module()
    text = _readme()
    assert mod.render(text) == text, "run python benchmarks/readme_tables.py"


def test_render_replaces_block_and_refuses_missing_file(tmp_path):
    mod = _module()
    (tmp_path / "t.md").write_text("| a |\n|---|\n| 1 |\n")
    text = "x\n<!-- results:t -->\nold\n<!-- /results:t -->\ny\n"
    assert mod.render(text, str(tmp_path)) == "x\n<!-- results:t -->\n| a |\n|---|\n| 1 |\n<!-- /results:t -->\ny\n"
    assert mod.block_names(text) == ["t"]
    with pytest.raises(FileNotFoundError, match="results:u"):
        mod.render("<!-- results:u -->\n<!-- /results:u -->", str(tmp_path))


def test_a_summary_block_is_the_first_paragraph_of_its_file(tmp_path):
    mod = _module()
    (tmp_path / "t.md").write_text("Numbers move by **0.1**; the verdicts do not change.\n\n| a |\n|---|\n")
    text = "x\n<!-- summary:t -->\nstale\n<!-- /summary:t -->\n"
    assert mod.render(text, str(tmp_path)) == (
        "x\n<!-- summary:t -->\nNumbers move by **0.1**; the verdicts do not change.\n<!-- /summary:t -->\n"
    )
    with pytest.raises(FileNotFoundError, match="summary:u"):
        mod.render("<!-- summary:u -->\n<!-- /summary:u -->", str(tmp_path))


def test_the_readme_says_how_far_the_main_job_moves_with_the_thread_count():
    text = _readme()
    table = text.index("<!-- /results:xml_vs_gap -->")
    summary = text.index("<!-- summary:thread_sensitivity -->")
    assert 0 < summary - table < 400  # beside the table


def test_every_method_has_one_headline_in_the_readme():
    mod = _module()
    names = mod.headline_names(_readme())
    assert names == ["xml", "template_block", "resolution_distillation", "explanation"]
    assert sorted(names) == sorted(mod.HEADLINES)
    for name in names:  # one line each, between its markers
        body = _readme().split(f"<!-- headline:{name} -->\n")[1].split(f"<!-- /headline:{name} -->")[0]
        assert body.count("\n") == 1 and body.startswith("**At our scale** (paper: ")


def test_the_readme_headlines_say_what_the_results_say():
    """Each comparison of each headline, re-derived from its results file: the difference and its 95 % t interval,
    the δ its benchmark judged it with (the Evidence states the same one), and the verdict the benchmark's own table
    gives (stored beside the comparison, Holm-corrected over that table), with the largest effect the interval leaves
    (max(|low|, |high|) of the t and bootstrap intervals) where it is inconclusive and contains 0."""
    mod = _module()
    for key, headline in mod.HEADLINES.items():
        line = mod.headline_line(headline)
        for e in headline.evidence:
            with open(os.path.join(ROOT, "benchmarks", "results", e.results + ".json"), encoding="utf-8") as f:
                c = mod.find(json.load(f), e.where)
            assert c["smallest_effect"] == e.smallest_effect and c["claim"] == e.claim and not e.flip, (key, e.label)
            m, (low, high) = c["mean_difference"], c["ci95"]
            s, d = e.scale, e.digits
            shown = f"{s * m:+.{d}f} [{s * low:+.{d}f}, {s * high:+.{d}f}] {e.unit}, δ = {s * e.smallest_effect:g}"
            word = c["verdict"]
            ends = [*c["ci95"], *(c.get("bootstrap_ci95") or ())]
            if word.startswith("inconclusive") and min(ends) <= 0 <= max(ends):
                word += f", effect within ±{s * max(-min(ends), max(ends)):.{d}f} {e.unit}"
            elif word.startswith("inconclusive"):
                word += f", Holm-adjusted p {c['p_holm']:.2g}"
            assert f"{e.label}, {c['n']} seeds: {shown}: {word}" in line, (key, shown, word)


def _results(tmp_path, mean, ci):
    comparisons = [{"variant": "xml", "baseline": "gap", "mean_difference": mean, "ci95": ci, "n": 3}]
    (tmp_path / "r.json").write_text(json.dumps({"comparisons": comparisons + [dict(comparisons[0], variant="b")]}))


def test_a_headline_is_written_from_its_results_file_and_a_stale_one_is_found(tmp_path):
    """Intervals alone (no p-value stored: the interval decides), δ = 0.01 (1 point): [0.01, 0.03] with mean 0.02 lies
    above 0 and 0.02 ≥ δ -> shown; flipped, -0.02 [-0.03, -0.01] for a "less" claim -> shown; after a rerun
    -0.001 [-0.02, +0.018] contains 0 and reaches past ±δ -> inconclusive, the interval leaving ±2.00 points; the
    runner's claim C of results.py (0.12 [0.070, 0.170] points, δ = 1) lies within ±δ -> no effect of practical
    size."""
    mod = _module()
    where = ("comparisons", {"variant": "xml", "baseline": "gap"})
    headlines = {
        "h": mod.Headline(
            "XML helps",
            (mod.Evidence("r", where, "XML − GAP", smallest_effect=0.01, scale=100, unit="points"),),
            "x.md",
        ),
        "flipped": mod.Headline(
            "GAP is worse", (mod.Evidence("r", where, "GAP − XML", smallest_effect=0.01, claim="less", flip=True),)
        ),
    }
    _results(tmp_path, 0.02, [0.01, 0.03])
    text = "a\n<!-- headline:h -->\nold\n<!-- /headline:h -->\n<!-- headline:flipped -->\n<!-- /headline:flipped -->\n"
    new = mod.render(text, str(tmp_path), headlines)
    assert new == (
        "a\n<!-- headline:h -->\n**At our scale** (paper: XML helps): XML − GAP, 3 seeds: +2.00 [+1.00, +3.00] points, "
        "δ = 1: shown. [All numbers](x.md).\n<!-- /headline:h -->\n<!-- headline:flipped -->\n**At our scale** "
        "(paper: GAP is worse): GAP − XML, 3 seeds: -0.02 [-0.03, -0.01], δ = 0.01: shown.\n"
        "<!-- /headline:flipped -->\n"
    )
    assert mod.render(new, str(tmp_path), headlines) == new and mod.headline_names(new) == ["h", "flipped"]
    _results(tmp_path, -0.001, [-0.02, 0.018])  # the benchmark reran: the README line is stale
    newer = mod.render(new, str(tmp_path), headlines)
    assert newer != new
    assert (
        "XML − GAP, 3 seeds: -0.10 [-2.00, +1.80] points, δ = 1: inconclusive (3 seeds), effect within ±2.00 points."
    ) in newer
    _results(tmp_path, 0.12, [0.070, 0.170])
    points = {"h": mod.Headline("p", (mod.Evidence("r", where, "C", smallest_effect=1.0, unit="points"),))}
    line = mod.render("<!-- headline:h -->\n<!-- /headline:h -->", str(tmp_path), points)
    assert "C, 3 seeds: +0.12 [+0.07, +0.17] points, δ = 1: no effect of practical size." in line


def test_a_stored_claim_is_read_with_its_own_delta_claim_and_holm_p(tmp_path):
    """The runner's hand-checked claim A of results.py (differences 2, 2.5, 3 points; t interval [1.258, 3.742]):
    shown with δ = 1 on its own (p 0.013), inconclusive once a table's Holm correction has put its p at 0.074 (the
    interval excludes 0: the line gives that p); an Evidence whose δ or claim differs from the stored one is refused."""
    mod = _module()
    a = {"variant": "A", "baseline": "b", "mean_difference": 2.5, "ci95": [1.258, 3.742], "n": 3,
         "bootstrap_ci95": [2.0, 3.0], "smallest_effect": 1.0, "claim": "greater", "p_value": 0.01307}  # fmt: skip
    where = ("comparisons", {"variant": "A"})
    evidence = mod.Evidence("r", where, "A − b", smallest_effect=1.0, unit="points")
    block = "<!-- headline:h -->\n<!-- /headline:h -->"
    for p_holm, word in ((0.01307, "shown"), (0.074, "inconclusive (3 seeds), Holm-adjusted p 0.074")):
        (tmp_path / "r.json").write_text(json.dumps({"comparisons": [dict(a, p_holm=p_holm)]}))
        line = mod.render(block, str(tmp_path), {"h": mod.Headline("p", (evidence,))})
        assert f"A − b, 3 seeds: +2.50 [+1.26, +3.74] points, δ = 1: {word}." in line
    other = {"h": mod.Headline("p", (mod.Evidence("r", where, "A − b", smallest_effect=0.5),))}
    with pytest.raises(ValueError, match="states δ = 0.5, its comparison was read with 1.0"):
        mod.render(block, str(tmp_path), other)
    other = {"h": mod.Headline("p", (mod.Evidence("r", where, "A − b", smallest_effect=1.0, claim="less"),))}
    with pytest.raises(ValueError, match="claims 'less', its comparison 'greater'"):
        mod.render(block, str(tmp_path), other)
    flipped = {
        "h": mod.Headline("p", (mod.Evidence("r", where, "b − A", smallest_effect=1.0, claim="less", flip=True),))
    }
    assert "b − A, 3 seeds: -2.50 [-3.74, -1.26], δ = 1: inconclusive (3 seeds), Holm-adjusted p 0.074." in mod.render(
        block, str(tmp_path), flipped
    )


def test_an_evidence_states_its_delta_and_a_known_claim():
    mod = _module()
    with pytest.raises(ValueError, match="'x': smallest_effect must be a positive number, got None"):
        mod.Evidence("r", (), "x")
    with pytest.raises(ValueError, match="claim must be one of greater, less, on_par, got 'better'"):
        mod.Evidence("r", (), "x", smallest_effect=1.0, claim="better")


def test_a_headline_without_its_file_entry_or_comparison_is_an_error(tmp_path):
    mod = _module()
    _results(tmp_path, 0.02, [0.01, 0.03])
    block = "<!-- headline:h -->\n<!-- /headline:h -->"
    missing = {"h": mod.Headline("p", (mod.Evidence("nope", ("comparisons", 0), "l", smallest_effect=0.01),))}
    with pytest.raises(FileNotFoundError, match="nope.json"):
        mod.render(block, str(tmp_path), missing)
    with pytest.raises(KeyError, match="headline:h"):
        mod.render(block, str(tmp_path), {})
    ambiguous = {
        "h": mod.Headline("p", (mod.Evidence("r", ("comparisons", {"baseline": "gap"}), "l", smallest_effect=1),))
    }
    with pytest.raises(KeyError, match="2 items match"):
        mod.render(block, str(tmp_path), ambiguous)
    absent = {"h": mod.Headline("p", (mod.Evidence("r", ("comparisons", 5), "l", smallest_effect=0.01),))}
    with pytest.raises(KeyError, match="no 5"):
        mod.render(block, str(tmp_path), absent)


def test_check_fails_on_a_stale_readme(tmp_path):
    mod = _module()
    stale = tmp_path / "README.md"
    stale.write_text(_readme().replace("no effect of practical size", "shown", 1))
    assert mod.main(["--check", "--readme", str(stale)]) == 1
    stale.write_text(_readme())
    assert mod.main(["--check", "--readme", str(stale)]) == 0


def test_the_claim_directions_are_the_runners():
    """readme_tables writes the claim directions itself (the docs build imports it without the package)."""
    from pml_extensions.utils.verdicts import CLAIMS

    assert _module().CLAIMS == CLAIMS
