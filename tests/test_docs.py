"""The documentation: no date stamp outside the changelog and the generated reports, every
relative Markdown link resolves, the README stays short and maps every page."""

import re
from pathlib import Path

import pytest
from tiny_run import ROOT

DOCS = ROOT / "docs"
# Pages a script writes whole from its record (benchmarks/*.py): a report keeps its dates.
GENERATED = {
    "docs/back_translation.md",  # benchmarks/workflows.py
    "docs/distillation.md",  # benchmarks/workflows.py
    "docs/lora_adaptation.md",  # benchmarks/lora_adapt.py
    "docs/mbr.md",  # benchmarks/mbr_vs_beam.py
}
# Dated by nature: the history, and the report of measurements with their dates and machines
# (hand-written around the blocks compare.py writes).
DATED = {"docs/changelog.md", "docs/benchmarks.md"}
# Blocks a script writes inside a hand-written page: <!-- NAME: begin --> ... <!-- NAME: end -->
BLOCK = re.compile(r"<!-- ([^:>]+): begin -->.*?<!-- \1: end -->", re.S)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b[0-2]\d:[0-5]\d(?:–[0-2]\d:[0-5]\d)? UTC\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def date_stamps(text: str) -> list[str]:
    """The date stamps of a page's prose: not inside a script's marked block, and not in a link
    target (a changelog anchor or a record's file name, such as ``compare_2026-12-04.json``)."""
    text = BLOCK.sub("", text)
    text = LINK.sub("]()", text)
    text = re.sub(r"`[^`\n]*\.json`", "", text)
    return DATE.findall(text)


@pytest.mark.parametrize(
    "page", [p for p in _pages() if _name(p) not in GENERATED | DATED], ids=_name
)
def test_no_date_stamp_in_a_hand_written_page(page):
    found = date_stamps(page.read_text(encoding="utf-8"))
    assert not found, (
        f"{_name(page)} has date stamps {found}: dated history belongs in docs/changelog.md "
        "under its date (link to it), dated figures in a generated report"
    )


def test_the_date_check_finds_stamps_and_spares_links_and_blocks():
    assert date_stamps("measured on 2026-12-03 at 17:30 UTC") == ["2026-12-03", "17:30 UTC"]
    assert date_stamps("(12:20–12:37 UTC, a run)") == ["12:20–12:37 UTC"]
    assert date_stamps("[changelog](changelog.md#2026-12-03), `data/compare_2026-12-04.json`") == []
    block = "<!-- x.py table: begin -->\n2026-12-06 20:44 UTC\n<!-- x.py table: end -->"
    assert date_stamps(block) == []


def test_the_generated_pages_are_written_by_a_script():
    scripts = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "benchmarks").glob("*.py"))
    for page in GENERATED:
        name = Path(page).name
        assert name in scripts or "{stem}.md" in scripts, page


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor of the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{_name(page)}: {target}")
    assert broken == []


def test_the_readme_is_short_and_maps_every_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for page in sorted(DOCS.rglob("*.md")):
        assert f"]({_name(page)})" in readme, f"the README's map lacks {_name(page)}"
