"""Every relative link in the docs, the README and experiments/ names a file that exists.

The pages quote the raw results in ``experiments/results/`` and link each other; a moved file (the
results left ``docs/results/`` for ``experiments/results/``, issue #60) must not leave a link behind.
A link is ``[text](target)``, ``![alt](target)`` or a reference definition ``[name]: target``
outside code; its ``#anchor`` is not checked, nor are links with a scheme (``https:``, ``mailto:``).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "experiments").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def links(text: str) -> list[str]:
    """The link targets of a markdown text, code blocks and code spans left out."""
    text = CODE.sub("", FENCE.sub("", text))
    found = [m.group(1) for m in INLINE.finditer(text)]
    # a reference definition starts a block (it cannot interrupt a paragraph: a wrapped line that
    # begins "[0.21, 0.28]: +2.0 points" is text)
    previous = ""
    for line in text.splitlines():
        m = REFERENCE.match(line)
        if m and (not previous.strip() or REFERENCE.match(previous)):
            found.append(m.group(1))
        previous = line
    return [target.strip("<>") for target in found]


def broken(page: Path) -> list[str]:
    """The relative targets of ``page`` that name no file or folder (anchors and schemes ignored)."""
    out = []
    for target in links(page.read_text()):
        path = unquote(target.split("#", 1)[0])
        if not path or SCHEME.match(path):
            continue
        if not (page.parent / path).exists():
            out.append(target)
    return out


def test_the_link_parser_finds_links_and_skips_code():
    text = (
        '[a](x.md) ![b](../img/p.png "title") [c](y.md#part) [d](https://e.org) [e](#here)\n'
        "`[f](in_span.md)`\n```\n[g](in_block.md)\n```\n\n[h]: ref.md\n[i](<with space.md>)\n"
        "a paragraph\n  [0.21, 0.28]: +2.0 points, wrapped\n"
    )
    assert links(text) == ["x.md", "../img/p.png", "y.md#part", "https://e.org", "#here", "with space.md", "ref.md"]


def test_a_missing_target_is_reported(tmp_path):
    (tmp_path / "there.md").write_text("")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a) [web](https://x.org) [top](#t) [gone](results/gone.json#k)\n")
    assert broken(page) == ["results/gone.json#k"]


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/README.md", "experiments/README.md", "experiments/results/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken(page) == [], f"{page.relative_to(ROOT)}: links to files that do not exist"
