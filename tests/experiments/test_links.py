"""Every relative link in the docs, the README and experiments/ names a file that exists.

The pages quote the raw results in ``experiments/results/`` and link each other; a moved file (the
results left ``docs/results/`` for ``experiments/results/``, issue #60) must not leave a link behind.
A link is ``[text](target)``, ``![alt](target)`` or a reference definition ``[name]: target``
outside code; links with a scheme (``https:``, ``mailto:``) are not checked. A ``#anchor`` into a
markdown page must name one of its headings as GitHub slugs them (sections move between pages: the
measured halves of docs/tools.md and docs/loss_variants.md went to experiments/, issue #60).
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


HEADING = re.compile(r"^[ \t]*#{1,6}\s+(.*?)\s*#*\s*$", re.M)  # in a list item too


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``.

    >>> slug("(a) GRPO with the calculator (`make tools`)")
    'a-grpo-with-the-calculator-make-tools'
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (code blocks left out; a repeated heading's ``-1``, ``-2``...)."""
    out: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        name, n = base, 0
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.add(name)
    return out


def broken(page: Path) -> list[str]:
    """The relative targets of ``page`` that name no file or folder, or a heading its markdown page
    lacks (schemes ignored)."""
    out = []
    for target in links(page.read_text()):
        path, _, anchor = target.partition("#")
        path = unquote(path)
        if SCHEME.match(path):
            continue
        dest = page.parent / path if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest)):
            out.append(target)
    return out


def test_the_link_parser_finds_links_and_skips_code():
    text = (
        '[a](x.md) ![b](../img/p.png "title") [c](y.md#part) [d](https://e.org) [e](#here)\n'
        "`[f](in_span.md)`\n```\n[g](in_block.md)\n```\n\n[h]: ref.md\n[i](<with space.md>)\n"
        "a paragraph\n  [0.21, 0.28]: +2.0 points, wrapped\n"
    )
    assert links(text) == ["x.md", "../img/p.png", "y.md#part", "https://e.org", "#here", "with space.md", "ref.md"]


def test_a_missing_target_or_heading_is_reported(tmp_path):
    there = "# A\n\n## (b) The `b` part\n\n- item\n\n  ### In it\n\n```\n# not a heading\n```\n"
    (tmp_path / "there.md").write_text(there)
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n[ok](there.md#a) [ok](there.md#b-the-b-part) [ok](there.md#in-it) [web](https://x.org) [top](#t)"
        " [gone](results/gone.json#k) [no](there.md#c) [code](there.md#not-a-heading) [self](#nowhere)\n"
    )
    assert broken(page) == ["results/gone.json#k", "there.md#c", "there.md#not-a-heading", "#nowhere"]


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/README.md", "experiments/README.md", "experiments/results/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken(page) == [], f"{page.relative_to(ROOT)}: links to files that do not exist"
