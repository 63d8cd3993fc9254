"""`cdclake demo`: the whole pipeline on embedded defaults (what `make demo` runs)."""

from __future__ import annotations

import click


@click.command()
@click.option("--more", is_flag=True, help="Stream another round of changes and apply them incrementally.")
def demo(more: bool) -> int:
    """Broker -> Debezium streams of Db2, Informix, Oracle, MongoDB -> bronze -> dbt silver, checked."""
    from ingest.demo import run
    from ingest.lakehouse import PROJECT_ROOT

    return 0 if run(PROJECT_ROOT, rounds_delta=1 if more else 0) else 1
