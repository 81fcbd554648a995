"""Griffe extension for the API pages: read the package's docstrings as the project writes them.

* continuation lines of an ``Args:`` / ``Raises:`` / ``Returns:`` item written at the item's own indentation (the
  project's habit) are indented under their item, so the Google-style parser keeps them in that item; a section
  written as prose (no ``name: description`` items) is shown as a titled paragraph;
* ``Example::`` (reStructuredText's literal-block marker) and ``Example:`` become the ``Examples:`` section, whose
  ``>>>`` lines render as code;
* Sphinx roles (``:func:`x```, ``:class:`x```, ...) become inline code;
* a module docstring that is a command-line usage text (it starts with ``usage:``) is shown verbatim.

Only the text handed to the renderer changes; the source stays as it is.
"""

import re

import griffe

_SECTION = re.compile(
    r"^(?P<indent>\s*)(?P<name>Args|Arguments|Parameters|Raises|Attributes|Keyword Args|Other Parameters|Warns"
    r"|Returns|Yields):\s*$"
)
_ITEM = re.compile(r"^[*\w.\[\]]+(\s*[,/]\s*[*\w.]+)*\s*(\([^)]*\))?\s*:(\s|$)")
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def fix_sections(text: str) -> str:
    """Indent the continuation lines of Google-style section items under their item."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        match = _SECTION.match(line)
        i += 1
        if not match:
            continue
        header = len(match.group("indent"))
        free_text = match.group("name") in ("Returns", "Yields")
        body = [x for x in lines[i:] if x.strip()]
        if body and _indent(body[0]) > header and not free_text and not _ITEM.match(body[0].strip()):
            # prose instead of ``name: description`` items: a bold title and the text as a paragraph
            out[-1] = " " * header + f"**{match.group('name')}:**"
            shift = _indent(body[0]) - header
            while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > header):
                out.append(lines[i][shift:] if lines[i].strip() else lines[i])
                i += 1
            continue
        item_indent, seen = None, 0
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                out.append(line)
                i += 1
                continue
            ind = _indent(line)
            if ind <= header:
                break
            if item_indent is None:
                item_indent = ind
            if ind == item_indent:
                seen += 1
                continuation = (free_text and seen > 1) or (not free_text and not _ITEM.match(line.strip()))
                if continuation:
                    line = " " * 4 + line
            out.append(line)
            i += 1
    return "\n".join(out)


def rewrite(text: str, is_module: bool = False) -> str:
    if is_module and text.lstrip().startswith("usage:"):
        return "```text\n" + text.strip("\n") + "\n```"
    text = re.sub(r"^([ \t]*)Examples?::?[ \t]*$", r"\1Examples:", text, flags=re.M)
    text = _ROLE.sub(lambda m: f"``{m.group(1)}``", text)
    return fix_sections(text)


class ProjectDocstrings(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value, is_module=obj.is_module)
