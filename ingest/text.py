"""How cdclake names many things in one message: the first few, then how many more."""

from __future__ import annotations

from collections.abc import Sequence


def first_few(names: Sequence[str], shown: int) -> str:
    """``a, b, c and 4 more``: the first ``shown`` of ``names``, then the count of the rest."""
    rest = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {rest} more" if rest > 0 else "")
