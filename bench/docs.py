"""docs/benchmarks.md: each benchmark owns one `## ` section and rewrites only that one."""

from __future__ import annotations

import re
from pathlib import Path

BENCHMARKS_DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


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
