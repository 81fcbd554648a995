"""The table model and its two renderers: Markdown (results.md) and HTML (report.html) from the same blocks."""

import pytest

from pml_extensions.runner.outputs.tables import (
    Items,
    Table,
    as_blocks,
    inline_html,
    to_html,
    to_json,
    to_markdown,
)


def _document():
    return [
        "Some `code` and **bold**.",
        Table(["a", "b"], [["x < y", "-0.5 ± 0.1"]], numeric=[False, True], caption="Title", notes=["Note."]),
        Items(["one", "two"], caption="List:"),
    ]


def test_markdown():
    assert to_markdown(_document()) == (
        "Some `code` and **bold**.\n\nTitle\n\n| a | b |\n|---|---|\n| x < y | -0.5 ± 0.1 |\n\nNote.\n\n"
        "List:\n- one\n- two\n"
    )
    assert to_markdown([]) == "" and to_markdown(["", "\n"]) == ""
    assert to_markdown([Table(["a|b"], [["c\nd"]])]) == "| a\\|b |\n|---|\n| c d |\n"  # a cell stays one cell


def test_html_escapes_and_aligns_numbers_by_column():
    # the assertions of the former markdown_html test, now on the blocks the report renders
    assert to_html(_document()) == (
        "<p>Some <code>code</code> and <b>bold</b>.</p>\n<p>Title</p>\n"
        "<table><tr><th>a</th><th>b</th></tr>\n<tr><td>x &lt; y</td><td class='num'>-0.5 ± 0.1</td></tr></table>\n"
        "<p>Note.</p>\n<p>List:</p>\n<ul><li>one</li><li>two</li></ul>"
    )
    assert to_html(["line 1\nline 2"]) == "<p class='lines'>line 1\nline 2</p>"  # shown line by line
    assert inline_html("<b>`x`</b>") == "&lt;b&gt;<code>x</code>&lt;/b&gt;"


def test_json_round_trip_and_bad_blocks():
    doc = _document()
    assert as_blocks(to_json(doc)) == doc
    assert as_blocks(None) == [] and as_blocks("text") == ["text"] and as_blocks("  ") == []
    assert as_blocks("a") == ["a"] and as_blocks("") == [] and as_blocks(None) == []
    assert as_blocks(doc[1]) == [doc[1]] and as_blocks(["", "b"]) == ["b"]
    with pytest.raises(ValueError, match="block 0"):
        as_blocks([{"nope": 1}])
    with pytest.raises(ValueError, match="row 0 has 1 cells, the table has 2 columns"):
        Table(["a", "b"], [["1"]])
    with pytest.raises(ValueError, match="numeric has 1 flags"):
        Table(["a", "b"], numeric=[True])
    with pytest.raises(TypeError, match="a block must be"):
        to_markdown([1])
    with pytest.raises(TypeError, match="a block must be"):
        to_html([1])
