"""The documentation's shape: README is a front page, docs/index.md maps every page, links resolve."""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _tracked_markdown():
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in out.split()]


def test_readme_is_a_front_page_and_the_changelog_exists():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, len(lines)
    assert "./run_local.sh" in "\n".join(lines[:12]) and "./run_local.sh test" in "\n".join(lines[:12])
    assert (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").startswith("# Changelog")


def test_docs_index_links_every_page():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    linked = {pathlib.PurePosixPath(t.split("#")[0]).name for t in LINK.findall(index)}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages and not pages - linked, f"docs/index.md does not link {sorted(pages - linked)}"


def test_every_relative_link_in_the_markdown_resolves():
    """A moved file or a renamed test leaves no dead link in README, docs/ or the other pages."""
    files = _tracked_markdown()
    assert len(files) > 10
    dead = []
    for md in files:
        text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)  # code blocks are not links
        for target in LINK.findall(text):
            path = target.split("#")[0]
            if not path or re.match(r"^[a-z]+:", path):  # an anchor of the same page, http(s):, mailto:
                continue
            base = ROOT if md.name == "BENCHMARKS_HEAD.md" else md.parent  # the head of the root's BENCHMARKS.md
            if not (base / path).exists():
                dead.append(f"{md.relative_to(ROOT)}: {target}")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_benchmarks_md_starts_with_its_head():
    """run_all --docs rewrites BENCHMARKS.md as BENCHMARKS_HEAD.md + the latest run: a section written only into
    BENCHMARKS.md above "## Latest run" would be lost at the next regeneration."""
    head = (ROOT / "benchmarks" / "BENCHMARKS_HEAD.md").read_text(encoding="utf-8")
    page = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert head.endswith("\n## Latest run\n") and head.count("\n## Latest run\n") == 1
    written = page[: page.index("\n## Latest run\n") + len("\n## Latest run\n")]
    assert written == head, "edit benchmarks/BENCHMARKS_HEAD.md and BENCHMARKS.md's head together"
