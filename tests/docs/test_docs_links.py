"""The docs hold together: links resolve, the index lists every page, the README is current.

Links are checked the way GitHub renders them: a relative path must exist,
and a ``#fragment`` into a Markdown file must name one of its headings
(GitHub's slugs: lower case, punctuation dropped, spaces to hyphens). Code
blocks are skipped. The README's captured ``llmgw plan`` is compared with what
the command prints now, revision aside, so it cannot go stale unnoticed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted([README, *DOCS.glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(`{3,}|~{3,})")


def prose(text: str) -> str:
    """The text without fenced code blocks (a link-like string in code is not a link)."""
    kept, fence = [], ""
    for line in text.splitlines():
        marker = FENCE.match(line.strip())
        if fence:
            if marker and line.strip().startswith(fence) and not line.strip()[len(fence):]:
                fence = ""
            continue
        if marker:
            fence = marker.group(1)
            continue
        kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.*)$", prose(page.read_text()), flags=re.M)
    return {slug(h) for h in headings}


def links(page: Path) -> list[str]:
    """Link targets outside code blocks and inline code spans."""
    return LINK.findall(re.sub(r"`[^`\n]*`", "", prose(page.read_text())))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: {resolved} does not exist")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_index_links_every_page_of_the_docs() -> None:
    index = DOCS / "index.md"
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in links(index)}
    pages = {p.resolve() for p in [*DOCS.glob("*.md"), *DOCS.glob("*.yml")] if p != index}
    missing = sorted(p.name for p in pages - linked)
    assert not missing, f"docs/index.md does not link: {missing}"


def test_readme_opens_with_the_two_commands() -> None:
    text = README.read_text()
    before_sections = text.split("\n## ", 1)[0]
    first_block = re.search(r"```[^\n]*\n(.*?)```", before_sections, flags=re.S)
    assert first_block, "the README's first code block comes before its first section"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make run", "make test"]


def test_readme_plan_is_what_llmgw_plan_prints_now() -> None:
    command = ("llmgw plan --cluster cluster.example --observed "
               "cluster.example/fleet-snapshot.json")
    text = README.read_text()
    block = re.search(r"```console\n\$ " + re.escape(command) + r"\n(.*?)```", text, flags=re.S)
    assert block, f"README.md has no console block for `{command}`"
    now = subprocess.run(
        [str(Path(sys.executable).parent / "llmgw"), *command.split()[1:]],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout

    def normalised(output: str) -> str:
        return re.sub(r"revision \S+", "revision R", output).rstrip()

    assert normalised(block.group(1)) == normalised(now)
