"""One table model for what a run reports: a document of blocks (paragraphs, bulleted lists, tables), built once from
a results file and rendered by two small renderers, to Markdown (``results.md``) by :func:`to_markdown` and to HTML
(``report.html``) by :func:`to_html`. Nothing parses Markdown: the report rebuilds the blocks from the JSON file.

A document is a list of blocks:

- a ``str`` is a paragraph. Its only inline markup is ```code``` and ``**bold**`` (valid Markdown, written to
  ``results.md`` as it is; the HTML renderer makes ``<code>`` and ``<b>`` of them). Its line breaks are kept;
- :class:`Items`: a bulleted list, with an optional line before it;
- :class:`Table`: column names, rows of cells (strings, formatted by whoever builds the table), which columns are
  numbers (right-aligned in HTML), an optional caption line above and note lines below.

In JSON (``results.json``'s ``text``, :func:`to_json` / :func:`from_json`) a paragraph stays a string, a list is
``{"items": [...], "caption": str}`` and a table ``{"table": {"columns", "rows", "numeric", "caption", "notes"}}``.

Example::

    >>> t = Table(["trial", "objective"], [["2 (best)", "0.5000"]], numeric=[False, True], caption="Best: **trial 2**.")
    >>> print(to_markdown([t, Items(["trial 3: NaN"], caption="Failed trials:")]))
    Best: **trial 2**.
    <BLANKLINE>
    | trial | objective |
    |---|---|
    | 2 (best) | 0.5000 |
    <BLANKLINE>
    Failed trials:
    - trial 3: NaN
    <BLANKLINE>
    >>> print(to_html([t]))
    <p>Best: <b>trial 2</b>.</p>
    <table><tr><th>trial</th><th>objective</th></tr>
    <tr><td>2 (best)</td><td class='num'>0.5000</td></tr></table>
"""

import html
import re
from dataclasses import dataclass, field
from typing import Any, List, Sequence, Union


@dataclass
class Table:
    """A table: ``columns`` (names), ``rows`` (one list of cell strings per row, as many as columns), ``numeric``
    (per column: right-aligned in HTML; empty: none), ``caption`` (a paragraph above) and ``notes`` (lines below).

    Raises:
        ValueError: a row or ``numeric`` whose length differs from the number of columns.
    """

    columns: Sequence[str]
    rows: Sequence[Sequence[str]] = ()
    numeric: Sequence[bool] = ()
    caption: str = ""
    notes: Sequence[str] = field(default_factory=list)

    def __post_init__(self):
        self.columns = [str(c) for c in self.columns]
        self.rows = [[str(c) for c in row] for row in self.rows]
        self.numeric = [bool(x) for x in self.numeric] or [False] * len(self.columns)
        self.notes = [str(n) for n in self.notes]
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"Table row {i} has {len(row)} cells, the table has {len(self.columns)} columns")
        if len(self.numeric) != len(self.columns):
            raise ValueError(f"Table numeric has {len(self.numeric)} flags, the table has {len(self.columns)} columns")


@dataclass
class Items:
    """A bulleted list (``items``, inline markup as a paragraph's), after an optional ``caption`` line."""

    items: Sequence[str]
    caption: str = ""


Block = Union[str, Items, Table]


def _markdown_cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def _markdown_block(block: Block) -> str:
    if isinstance(block, str):
        return block.strip("\n")
    if isinstance(block, Items):
        return "\n".join(([block.caption] if block.caption else []) + [f"- {item}" for item in block.items])
    if isinstance(block, Table):
        lines = [block.caption, ""] if block.caption else []
        lines.append("| " + " | ".join(_markdown_cell(c) for c in block.columns) + " |")
        lines.append("|" + "---|" * len(block.columns))
        lines += ["| " + " | ".join(_markdown_cell(c) for c in row) + " |" for row in block.rows]
        if block.notes:
            lines += ["", *block.notes]
        return "\n".join(lines)
    raise TypeError(f"a block must be a str, Items or Table, got {type(block).__name__}")


def to_markdown(blocks: Sequence[Block]) -> str:
    """The blocks as Markdown, separated by blank lines, ending with a newline (``""`` for no blocks)."""
    parts = [_markdown_block(b) for b in blocks]
    parts = [p for p in parts if p]
    return "\n\n".join(parts) + "\n" if parts else ""


def inline_html(text: str) -> str:
    """``text`` escaped for HTML, its ```code``` and ``**bold**`` spans as ``<code>`` and ``<b>``.

    Example::

        >>> inline_html("`a<b` and **c**")
        '<code>a&lt;b</code> and <b>c</b>'
    """
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _paragraph_html(text: str) -> str:
    text = text.strip("\n")
    if not text:
        return ""
    return f"<p class='lines'>{inline_html(text)}</p>" if "\n" in text else f"<p>{inline_html(text)}</p>"


def _html_block(block: Block) -> str:
    if isinstance(block, str):
        return _paragraph_html(block)
    if isinstance(block, Items):
        head = _paragraph_html(block.caption) + "\n" if block.caption else ""
        return head + "<ul>" + "".join(f"<li>{inline_html(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        out = [_paragraph_html(block.caption)] if block.caption else []
        head = "".join(f"<th>{inline_html(c)}</th>" for c in block.columns)
        rows = [f"<table><tr>{head}</tr>"]
        for row in block.rows:
            cells = "".join(
                f"<td class='num'>{inline_html(c)}</td>" if num else f"<td>{inline_html(c)}</td>"
                for c, num in zip(row, block.numeric)
            )
            rows.append(f"<tr>{cells}</tr>")
        out.append("\n".join(rows) + "</table>")
        out += [_paragraph_html(note) for note in block.notes]
        return "\n".join(out)
    raise TypeError(f"a block must be a str, Items or Table, got {type(block).__name__}")


def to_html(blocks: Sequence[Block]) -> str:
    """The blocks as HTML (``<p>``, ``<ul>``, ``<table>``; a numeric column's cells have ``class='num'``; a
    paragraph with line breaks has ``class='lines'``, which the report shows line by line)."""
    return "\n".join(part for part in (_html_block(b) for b in blocks) if part)


def to_json(blocks: Sequence[Block]) -> List[Any]:
    """The blocks as JSON values (see the module docstring); :func:`from_json` reads them back."""
    out: List[Any] = []
    for b in blocks:
        if isinstance(b, str):
            out.append(b)
        elif isinstance(b, Items):
            out.append({"items": list(b.items), "caption": b.caption})
        elif isinstance(b, Table):
            out.append(
                {
                    "table": {
                        "columns": list(b.columns),
                        "rows": [list(r) for r in b.rows],
                        "numeric": list(b.numeric),
                        "caption": b.caption,
                        "notes": list(b.notes),
                    }
                }
            )
        else:
            raise TypeError(f"a block must be a str, Items or Table, got {type(b).__name__}")
    return out


def from_json(values: Any) -> List[Block]:
    """Blocks from their JSON form (:func:`to_json`); a single string is one paragraph, ``None`` none.

    Raises:
        ValueError: a value that is no block.
    """
    if values is None:
        return []
    if isinstance(values, str):
        return [values] if values.strip() else []
    out: List[Block] = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict) and "table" in v:
            out.append(Table(**v["table"]))
        elif isinstance(v, dict) and "items" in v:
            out.append(Items(list(v["items"]), v.get("caption", "")))
        else:
            raise ValueError(f"block {i} must be a string, {{'items': [...]}} or {{'table': {{...}}}}, got {v!r}")
    return out


def as_blocks(text: Union[None, str, Block, Sequence[Block]]) -> List[Block]:
    """A header or footer as blocks: a string is one paragraph (kept as written), a block one block, a sequence of
    blocks itself; ``None`` or ``""`` nothing."""
    if text is None:
        return []
    if isinstance(text, str):
        return [text] if text.strip() else []
    if isinstance(text, (Items, Table)):
        return [text]
    return [b for b in text if not (isinstance(b, str) and not b.strip())]
