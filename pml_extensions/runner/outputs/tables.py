"""One table model for what a run reports: a document of blocks, built once from a results file and rendered to
Markdown (``results.md``, :func:`to_markdown`) and to HTML (``report.html``, :func:`to_html`); nothing parses Markdown.

A block is a paragraph (a ``str``: line breaks kept, its only inline markup ```code``` and ``**bold**``), an
:class:`Items` bulleted list or a :class:`Table`. In JSON (``results.json``'s ``text``, :func:`to_json` /
:func:`as_blocks`) a paragraph stays a string, a list is ``{"items": [...], "caption": str}`` and a table
``{"table": {"columns", "rows", "numeric", "caption", "notes"}}``.

Example::

    >>> t = Table(["trial", "objective"], [["2 (best)", "0.5000"]], numeric=[False, True], caption="Best: **trial 2**.")
    >>> print(to_markdown([t]))
    Best: **trial 2**.
    <BLANKLINE>
    | trial | objective |
    |---|---|
    | 2 (best) | 0.5000 |
    <BLANKLINE>
    >>> print(to_html([t]))
    <p>Best: <b>trial 2</b>.</p>
    <table><tr><th>trial</th><th>objective</th></tr>
    <tr><td>2 (best)</td><td class='num'>0.5000</td></tr></table>
"""

import html
import re
from dataclasses import asdict, dataclass, field
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


def _render(blocks: Sequence[Block], render) -> List[Any]:
    """``render(block)`` of each block (TypeError for anything that is no block)."""
    for block in blocks:
        if not isinstance(block, (str, Items, Table)):
            raise TypeError(f"a block must be a str, Items or Table, got {type(block).__name__}")
    return [render(block) for block in blocks]


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("\n", " ").replace("|", "\\|") for c in cells) + " |"


def _markdown_block(block: Block) -> str:
    if isinstance(block, str):
        return block.strip("\n")
    if isinstance(block, Items):
        return "\n".join(([block.caption] if block.caption else []) + [f"- {item}" for item in block.items])
    lines = [block.caption, ""] if block.caption else []
    lines += [_markdown_row(block.columns), "|" + "---|" * len(block.columns), *map(_markdown_row, block.rows)]
    return "\n".join(lines + (["", *block.notes] if block.notes else []))


def to_markdown(blocks: Sequence[Block]) -> str:
    """The blocks as Markdown, separated by blank lines, ending with a newline (``""`` for no blocks)."""
    parts = [part for part in _render(blocks, _markdown_block) if part]
    return "\n\n".join(parts) + "\n" if parts else ""


def inline_html(text: str) -> str:
    """``text`` escaped for HTML, its ```code``` and ``**bold**`` spans as ``<code>`` and ``<b>``.

    Example::

        >>> inline_html("`a<b` and **c**")
        '<code>a&lt;b</code> and <b>c</b>'
    """
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _paragraph_html(text: str) -> str:
    text = text.strip("\n")
    if not text:
        return ""
    return f"<p class='lines'>{inline_html(text)}</p>" if "\n" in text else f"<p>{inline_html(text)}</p>"


_TD = {False: "<td>", True: "<td class='num'>"}


def _html_block(block: Block) -> str:
    if isinstance(block, str):
        return _paragraph_html(block)
    parts = [_paragraph_html(block.caption)] if block.caption else []
    if isinstance(block, Items):
        return "\n".join(parts + ["<ul>" + "".join(f"<li>{inline_html(item)}</li>" for item in block.items) + "</ul>"])
    rows = ["<tr>" + "".join(f"<th>{inline_html(c)}</th>" for c in block.columns) + "</tr>"]
    for row in block.rows:
        rows.append("<tr>" + "".join(f"{_TD[n]}{inline_html(c)}</td>" for c, n in zip(row, block.numeric)) + "</tr>")
    parts.append("<table>" + "\n".join(rows) + "</table>")
    return "\n".join(parts + [_paragraph_html(note) for note in block.notes])


def to_html(blocks: Sequence[Block]) -> str:
    """The blocks as HTML (``<p>``, ``<ul>``, ``<table>``; a numeric column's cells have ``class='num'``; a
    paragraph with line breaks has ``class='lines'``, which the report shows line by line)."""
    return "\n".join(part for part in _render(blocks, _html_block) if part)


def to_json(blocks: Sequence[Block]) -> List[Any]:
    """The blocks as JSON values (see the module docstring); :func:`as_blocks` reads them back."""
    return _render(
        blocks, lambda b: b if isinstance(b, str) else {"table": asdict(b)} if isinstance(b, Table) else asdict(b)
    )


def as_blocks(value: Any) -> List[Block]:
    """Blocks from a header or footer, or from their JSON form (:func:`to_json`): ``None`` or ``""`` nothing, a string
    one paragraph (kept as written), a block one block, a sequence of blocks or JSON values itself (blank paragraphs
    left out); ``ValueError`` for a value that is no block."""
    if value is None:
        return []
    out: List[Block] = []
    for i, v in enumerate([value] if isinstance(value, (str, Items, Table)) else value):
        if isinstance(v, dict) and "table" in v:
            v = Table(**v["table"])
        elif isinstance(v, dict) and "items" in v:
            v = Items(list(v["items"]), v.get("caption", ""))
        elif not isinstance(v, (str, Items, Table)):
            raise ValueError(f"block {i} must be a string, {{'items': [...]}} or {{'table': {{...}}}}, got {v!r}")
        out += [] if isinstance(v, str) and not v.strip() else [v]
    return out
