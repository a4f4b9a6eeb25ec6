"""Every relative link and image in README.md and docs/**/*.md names a file or folder of the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pages() -> list[Path]:
    """README.md, then docs/**/*.md that git tracks or would (the run folders under docs/results hold ignored model
    cards: a clean clone has none); every docs page where git is not at hand."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "docs/*.md"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [ROOT / "README.md", *sorted(page for page in map(ROOT.joinpath, listed) if page.exists())]


PAGES = pages()
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)  # code blocks and spans: not links


def relative_links(page: Path) -> list[str]:
    """The page's link and image targets that name a path (no URL, no in-page anchor), anchors cut."""
    text = CODE.sub("", page.read_text())
    targets = [match.group(1) for match in LINK.finditer(text)]
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [target for target in relative_links(page) if not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_pages_have_links():
    """The check reads links at all: README links the reference pages and the studies."""
    assert {"docs/SEMANTICS.md", "docs/config.md", "docs/studies/real_model.md"} <= set(relative_links(PAGES[0]))
