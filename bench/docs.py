"""docs/benchmarks.md: each benchmark owns one `## ` section and rewrites only that one.

What a run's figures do not say (where a target stands and why, what each part costs, what was tried) is written by
hand in docs/benchmark-notes.md, under the same headings: a `--write` run replaces its section whole, so notes kept
there would be lost with every run.
"""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS_DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
NOTES_DOC = BENCHMARKS_DOC.with_name("benchmark-notes.md")


def notes_line(heading: str) -> str:
    """The last line of a generated section: a link to the notes by hand under the same heading in NOTES_DOC."""
    title = heading.removeprefix("## ").strip()
    anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")  # GitHub's heading anchors
    return (
        f"Notes by hand on this run and the earlier ones (where the target stands and why, what each part costs, "
        f"what was tried): [{NOTES_DOC.name}, {title}]({NOTES_DOC.name}#{anchor})."
    )


def replace_section(heading: str, section: str, path: Path = BENCHMARKS_DOC) -> None:
    """Replace the section of ``path`` under ``heading`` (a `## ` line) with ``section``, or append it; the other
    sections stay as they are. A missing file is created."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# Benchmarks\n\n" + section)
        return
    text = path.read_text()
    match = re.search(rf"^{re.escape(heading)}[ \t]*\n.*?(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    if match is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        following = text[match.end() :]
        text = text[: match.start()] + section + ("\n" + following if following else "")
    path.write_text(text)
