"""`cdclake status`: rows, offsets, lag, dead letters per bronze table and how far silver is behind.

Exit codes: 0 fresh, 3 stale (a bronze table not committed for --stale-after seconds while records wait for it or
its lag is unknown, or a silver table behind bronze for longer than that). A table not committed for that long with
lag 0 on every partition is idle, not stale. Reads Iceberg metadata only; no Spark.
"""

from __future__ import annotations

import datetime as dt

import click
import orjson
from rich.console import Console

from ingest.cli.common import config_option, settings_from
from ingest.config import redact, redact_values
from ingest.lakehouse import require_catalog_file
from ingest.status import (
    DEFAULT_STALE_AFTER_S,
    BronzeStatus,
    LakehouseStatus,
    collect_status,
    format_age,
    idle_tables,
    stale_problems,
    status_document,
)
from ingest.text import first_few

STALE_EXIT_CODE = 3


@click.command()
@config_option
@click.argument("tables", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (for scripts and monitoring).")
@click.option(
    "--stale-after",
    type=click.FloatRange(min=0),
    default=DEFAULT_STALE_AFTER_S,
    show_default=True,
    help=(
        "Exit with code 3 when a bronze table's last commit, or silver's lag behind bronze, is older (seconds), "
        "unless the table's lag was read as 0 on every partition (nothing waiting: shown as idle); "
        "also for a bronze table with no ingest commit, a topic whose records are all dead letters (one within "
        "this time), a topic of the subscription that holds records but has no bronze table (with --lag), and a "
        "partition whose log starts after bronze's next offset (records deleted unlanded)."
    ),
)
@click.option("--lag/--no-lag", default=True, show_default=True, help="Ask the Kafka cluster for consumer lag.")
@click.option(
    "--max-lag",
    type=click.IntRange(min=0),
    default=None,
    help="Exit with code 3 also when a partition has more records than this not landed (per partition: a stalled "
    "one shows while its table's others commit), or when a partition's lag could not be read (broker unreachable, "
    "--no-lag). Off by default.",
)
@click.option("--lag-timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True, help="Seconds.")
@click.pass_context
def status(
    ctx: click.Context,
    tables: tuple[str, ...],
    as_json: bool,
    stale_after: float,
    lag: bool,
    max_lag: int | None,
    lag_timeout: float,
) -> None:
    """Show bronze and silver tables: rows, offsets, lag, dead letters, freshness (TABLES: bronze names)."""
    settings = settings_from(ctx)
    # Opening a missing one would create an empty catalog, and the status of an empty lakehouse is "fresh".
    require_catalog_file(settings)
    result = collect_status(settings, tables=list(tables) or None, check_lag=lag, lag_timeout_s=lag_timeout)
    problems = stale_problems(result, stale_after, max_lag=max_lag)
    if as_json:
        document = status_document(result, stale_after, problems)
        click.echo(orjson.dumps(redact_values(document, settings), option=orjson.OPT_INDENT_2).decode())
    else:
        console = Console(soft_wrap=False)
        if not console.is_terminal:
            console.width = max(console.width, 160)  # logs and pipes: no wrapping at 80 columns
        with console.capture() as capture:
            _render(console, result, problems, stale_after)
        click.echo(redact(capture.get(), settings), nl=False)
        if problems:
            err = Console(stderr=True, soft_wrap=True)
            with err.capture() as capture:
                err.print(f"[bold red]stale[/] (--stale-after {stale_after:g}s):")
                for problem in problems:
                    err.print(f"  [red]•[/] {problem}", markup=True, highlight=False)
            click.echo(redact(capture.get(), settings), nl=False, err=True)
    if problems:
        ctx.exit(STALE_EXIT_CODE)


def _when(value: dt.datetime | None, now: dt.datetime) -> str:
    if value is None:
        return "-"
    return f"{format_age(now - value)} ago ({value:%Y-%m-%d %H:%M}Z)"


def _offsets(table: BronzeStatus) -> str:
    """One line per partition; the topic is named only when the table holds more than one."""
    several = len({p.topic for p in table.partitions}) > 1
    lines = []
    for p in table.partitions:
        offset = "-" if p.next_offset is None else f"{p.next_offset:,}"  # nothing landed yet
        lines.append(f"{p.topic + ' ' if several else ''}[{p.partition}] {offset}")
    return "\n".join(lines) or "-"


def _lag(table: BronzeStatus, checked: bool) -> str:
    if not checked:
        return "-"
    lines = []
    for p in table.partitions:
        lines.append(f"{p.lag:,}" if p.lag is not None else "n/a")
    return "\n".join(lines) or "-"


def _render(console: Console, status: LakehouseStatus, problems: list[str], stale_after: float) -> None:
    from rich.table import Table
    from rich.text import Text

    now = status.generated_at
    source = status.source or "none"
    console.print(
        Text(
            f"catalog {status.catalog}  bronze {status.bronze_namespace}  silver {status.silver_namespace}  "
            f"source {source}",
            style="dim",
        )
    )
    bronze = Table(title="bronze", title_justify="left", show_lines=True)
    for column, justify in (
        ("table", "left"),
        ("rows", "right"),
        ("last commit", "left"),
        ("next offsets", "left"),
        ("lag", "right"),
        ("dead letters", "right"),
    ):
        bronze.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    lag_notes: dict[str, list[str]] = {}  # why the lag is unknown -> the partitions it is unknown for
    for table in status.tables:
        dead = sum(table.dead_letters.values())
        bronze.add_row(
            table.name,
            "-" if table.rows is None else f"{table.rows:,}",
            _when(table.last_commit, now),
            _offsets(table),
            _lag(table, status.lag_checked),
            Text(f"{dead:,}", style="red") if dead else Text("0"),
        )
        for p in table.partitions:
            if status.lag_checked and p.lag_error:
                lag_notes.setdefault(p.lag_error, []).append(f"{p.topic}[{p.partition}]")
    if not status.tables:
        console.print(f"no bronze tables in {status.catalog}.{status.bronze_namespace}")
    else:
        console.print(bronze)
    # One line per reason: an unreachable broker is one reason for every partition, not a line each.
    for reason, listed in lag_notes.items():
        partitions = list(dict.fromkeys(listed))  # a topic's partitions may be in an old table and a new one
        console.print(Text(f"lag n/a: {first_few(partitions, 3)}: {reason}", style="yellow"))

    silvers = [item for table in status.tables for item in table.silvers]
    if silvers:
        silver = Table(title="silver", title_justify="left", show_lines=True)
        for column in ("table", "applied bronze snapshot", "state", "max _cdc_applied_at"):
            silver.add_column(column, overflow="fold")
        for item in silvers:
            if item.behind is None:
                state = Text("unknown (no applied snapshot recorded)", style="yellow")
            elif item.behind:
                since = _when(item.behind_since, now) if item.behind_since else "unknown"
                holding = (
                    f", holding {item.held_transactions:,} incomplete transaction(s)" if item.held_transactions else ""
                )
                state = Text(f"behind since {since}{holding}", style="yellow")
            else:
                state = Text("up to date", style="green")
            applied = "-" if item.applied_snapshot_id is None else str(item.applied_snapshot_id)
            if item.applied_snapshot_at is not None:
                applied += f"\n{item.applied_snapshot_at:%Y-%m-%d %H:%M:%S}Z"
            silver.add_row(item.table, applied, state, _when(item.applied_at_max, now))
        console.print(silver)

    for table in status.tables:
        for topic, count in table.dead_letters.items():
            reason = _latest_reason(table.dead_letters_latest_error.get(topic))
            console.print(Text(f"dead letters: {count:,} from {topic} -> {table.table}{reason}", style="red"))
    for topic, count in status.dead_letters_without_table.items():
        reason = _latest_reason(status.dead_letters_without_table_latest_error.get(topic))
        console.print(Text(f"dead letters: {count:,} from {topic} (no bronze table){reason}", style="red"))
    if status.dead_letters_without_table or any(table.dead_letters for table in status.tables):
        console.print("after a fix, `cdclake replay-dead-letters` lands those that decode then")
    for topic, count in status.topics_without_table.items():
        console.print(Text(f"not landed: {count:,} record(s) of {topic} (no bronze table)", style="red"))
    for name in idle_tables(status, stale_after):
        table = next(item for item in status.tables if item.table == name)
        assert table.last_commit is not None
        console.print(
            Text(f"idle: {name}: last commit {format_age(now - table.last_commit)} ago, nothing waiting (lag 0)")
        )
    if not problems:
        console.print(Text(f"fresh (--stale-after {stale_after:g}s)", style="green"))


def _latest_reason(error: str | None, limit: int = 300) -> str:
    """``; the latest: <kind>: <error>``, cut to ``limit`` characters (the dead-letter table holds it whole)."""
    if error is None:
        return ""
    return "; the latest: " + (error if len(error) <= limit else error[: limit - 3] + "...")
