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
    """Each comparison of each headline, re-derived from its results file: the difference and its 95 % CI, and the
    issue's words "no effect larger than X" exactly where the CI contains 0, X = max(|low|, |high|) (hand-computed
    here from the interval)."""
    mod = _module()
    for key, headline in mod.HEADLINES.items():
        line = mod.headline_line(headline)
        for e in headline.evidence:
            assert e.claim in ("greater", "less"), key
            with open(os.path.join(ROOT, "benchmarks", "results", e.results + ".json"), encoding="utf-8") as f:
                c = mod.find(json.load(f), e.where)
            m, (low, high) = c.get("mean_difference", c.get("mean")), c["ci95"]
            if e.flip:
                m, low, high = -m, -high, -low
            s, d = e.scale, e.digits
            shown = f"{s * m:+.{d}f} [{s * low:+.{d}f}, {s * high:+.{d}f}] {e.unit}".rstrip()
            if low <= 0 <= high:
                word = f"no effect larger than {s * max(-low, high):.{d}f} {e.unit}".rstrip()
            else:
                word = "reproduced" if (low > 0) == (e.claim == "greater") else "contradicted"
            assert f"{e.label}, " in line and f"{shown}, {word}" in line, (key, shown, word)


def _results(tmp_path, mean, ci):
    comparisons = [{"variant": "xml", "baseline": "gap", "mean_difference": mean, "ci95": ci, "n": 3}]
    (tmp_path / "r.json").write_text(json.dumps({"comparisons": comparisons + [dict(comparisons[0], variant="b")]}))


def test_a_headline_is_written_from_its_results_file_and_a_stale_one_is_found(tmp_path):
    mod = _module()
    where = ("comparisons", {"variant": "xml", "baseline": "gap"})
    headlines = {
        "h": mod.Headline("XML helps", (mod.Evidence("r", where, "XML − GAP", scale=100, unit="points"),), "x.md"),
        "flipped": mod.Headline("GAP is worse", (mod.Evidence("r", where, "GAP − XML", claim="less", flip=True),)),
    }
    _results(tmp_path, 0.02, [0.01, 0.03])
    text = "a\n<!-- headline:h -->\nold\n<!-- /headline:h -->\n<!-- headline:flipped -->\n<!-- /headline:flipped -->\n"
    new = mod.render(text, str(tmp_path), headlines)
    assert new == (
        "a\n<!-- headline:h -->\n**At our scale** (paper: XML helps): XML − GAP, 3 seeds: +2.00 [+1.00, +3.00] points, "
        "reproduced. [All numbers](x.md).\n<!-- /headline:h -->\n<!-- headline:flipped -->\n**At our scale** "
        "(paper: GAP is worse): GAP − XML, 3 seeds: -0.02 [-0.03, -0.01], reproduced.\n<!-- /headline:flipped -->\n"
    )
    assert mod.render(new, str(tmp_path), headlines) == new and mod.headline_names(new) == ["h", "flipped"]
    _results(tmp_path, -0.001, [-0.02, 0.018])  # the benchmark reran: the README line is stale
    newer = mod.render(new, str(tmp_path), headlines)
    assert newer != new
    assert "XML − GAP, 3 seeds: -0.10 [-2.00, +1.80] points, no effect larger than 2.00 points." in newer


def test_a_headline_without_its_file_entry_or_comparison_is_an_error(tmp_path):
    mod = _module()
    _results(tmp_path, 0.02, [0.01, 0.03])
    block = "<!-- headline:h -->\n<!-- /headline:h -->"
    missing = {"h": mod.Headline("p", (mod.Evidence("nope", ("comparisons", 0), "l"),))}
    with pytest.raises(FileNotFoundError, match="nope.json"):
        mod.render(block, str(tmp_path), missing)
    with pytest.raises(KeyError, match="headline:h"):
        mod.render(block, str(tmp_path), {})
    ambiguous = {"h": mod.Headline("p", (mod.Evidence("r", ("comparisons", {"baseline": "gap"}), "l"),))}
    with pytest.raises(KeyError, match="2 items match"):
        mod.render(block, str(tmp_path), ambiguous)
    absent = {"h": mod.Headline("p", (mod.Evidence("r", ("comparisons", 5), "l"),))}
    with pytest.raises(KeyError, match="no 5"):
        mod.render(block, str(tmp_path), absent)


def test_check_fails_on_a_stale_readme(tmp_path):
    mod = _module()
    stale = tmp_path / "README.md"
    stale.write_text(_readme().replace("no effect larger than", "shown", 1))
    assert mod.main(["--check", "--readme", str(stale)]) == 1
    stale.write_text(_readme())
    assert mod.main(["--check", "--readme", str(stale)]) == 0
