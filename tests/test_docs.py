"""The README and docs/ point only at what exists: every relative link and picture names a
file of the repository, and a link to a heading names one the page has. The README keeps
the two commands CI and newcomers rely on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.M)}


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (fragment and dest.is_file()
                                 and fragment not in anchors(dest)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_names_an_existing_file_and_heading(page):
    assert broken_links(page) == []


def test_a_missing_file_and_a_missing_heading_are_both_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-here) [gone](gone.md) [no](there.md#nowhere)\n"
                    "```\n[in code](ignored.md)\n```\n[web](https://example.com/x)\n")
    assert broken_links(page) == ["gone.md", "there.md#nowhere"]


def test_the_readme_keeps_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## The two commands\n.*?```bash\n(.*?)```", readme, flags=re.S).group(1)
    assert [line.split()[0] for line in block.splitlines() if line.startswith("./")] == [
        "./scripts/run", "./scripts/test"]
    assert "./scripts/test -q" in (ROOT / ".ci" / "run").read_text()
