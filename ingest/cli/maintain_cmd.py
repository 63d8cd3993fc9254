"""`cdclake maintain`: compaction, snapshot expiry, orphan-file removal and manifest rewrites, through Spark."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ingest.cli.common import config_option, settings_from
from ingest.config import MaintenanceSettings, redact
from ingest.maintenance import (
    LAYERS,
    Layer,
    StepResult,
    TablePlan,
    maintenance_settings,
    plan_maintenance,
    run_maintenance,
)

# The result columns worth a glance, per procedure (the summary table shows the rest only when non-zero).
_SHORT = {
    "rewritten_data_files_count": "rewritten files",
    "added_data_files_count": "added files",
    "removed_delete_files_count": "removed delete files",
    "failed_data_files_count": "failed files",
    "rewritten_delete_files_count": "rewritten delete files",
    "added_delete_files_count": "added delete files",
    "rewritten_manifests_count": "rewritten manifests",
    "added_manifests_count": "added manifests",
    "deleted_data_files_count": "deleted data files",
    "deleted_position_delete_files_count": "deleted delete files",
    "deleted_manifest_files_count": "deleted manifests",
    "deleted_manifest_lists_count": "deleted manifest lists",
    "orphan_files_count": "orphan files",
}
_ALWAYS = {"rewritten_data_files_count", "added_data_files_count", "rewritten_manifests_count", "orphan_files_count"}


def _override(config: MaintenanceSettings, layers: tuple[Layer, ...], **changes: Any) -> MaintenanceSettings:
    changes = {key: value for key, value in changes.items() if value is not None}
    if not changes:
        return config
    update: dict[str, Any] = {layer: config.layer(layer).model_copy(update=changes) for layer in layers}
    return config.model_copy(update=update)


@click.command()
@config_option
@click.option(
    "--layer",
    type=click.Choice(["bronze", "silver", "all"]),
    default="all",
    show_default=True,
    help="Which tables to maintain.",
)
@click.option("--table", "tables", multiple=True, help="Only this table (name without namespace); repeatable.")
@click.option("--dry-run", is_flag=True, help="Show the procedure calls and what they would touch; start no Spark.")
@click.option("--retain-last", type=click.IntRange(min=1), help="Override: snapshots always kept per table.")
@click.option(
    "--expire-older-than",
    "expire_hours",
    type=click.FloatRange(min=0),
    help="Override: expire snapshots older (hours).",
)
@click.pass_context
def maintain(
    ctx: click.Context,
    layer: str,
    tables: tuple[str, ...],
    dry_run: bool,
    retain_last: int | None,
    expire_hours: float | None,
) -> None:
    """Compact, expire snapshots, remove orphan files and rewrite manifests of every table of a layer.

    Offsets survive: the ingester resumes from a table property that every commit carries forward, and the
    bronze snapshot a silver table has applied is never expired (while maintenance.keep_silver_position is on, the
    default).
    """
    from ingest.lakehouse import load_catalog

    settings = settings_from(ctx)
    layers: tuple[Layer, ...] = LAYERS if layer == "all" else (layer,)  # type: ignore[assignment]
    config = _override(
        maintenance_settings(settings), layers, retain_last=retain_last, expire_older_than_hours=expire_hours
    )
    catalog = load_catalog(settings, create=False)
    plans = plan_maintenance(catalog, settings, config, layers, tables or None)
    out = Console(soft_wrap=False)
    if not out.is_terminal:
        out.width = max(out.width, 160)  # logs and pipes: no wrapping at 80 columns
    err = Console(stderr=True)
    if not err.is_terminal:
        err.width = max(err.width, 160)
    if not plans:
        err.print(f"nothing to maintain in layer {layer}" + (f" (tables {', '.join(tables)})" if tables else ""))
        return
    unreadable = [(plan.table, redact(plan.error, settings)) for plan in plans if plan.error]
    if dry_run:
        _print_plan(out, plans)
        _fail_unreadable(ctx, err, unreadable)
        return

    from ingest.spark import spark_session

    steps = sum(len(plan.steps) for plan in plans)
    with err.status("starting Spark"):
        spark = spark_session(settings)
    results = _run_with_progress(err, spark, catalog, plans, steps, lambda text: redact(text, settings))
    out.print(_summary(results))
    failed = [result for result in results if not result.ok]
    for result in failed:
        err.print(Text(f"{result.step.table} {result.step.procedure}: {result.error or 'failed'}", style="red"))
    _fail_unreadable(ctx, err, unreadable, failed=bool(failed))


def _fail_unreadable(ctx: click.Context, err: Console, unreadable: list[tuple[str, str]], failed: bool = False) -> None:
    """Exit 1 naming each table that could not be read (the others were maintained), or when a step failed."""
    for table, error in unreadable:
        err.print(Text(f"{table}: {error}; not maintained (repair or drop it)", style="red"), soft_wrap=True)
    if unreadable or failed:
        ctx.exit(1)


def _run_with_progress(
    err: Console, spark: Any, catalog: Any, plans: list[TablePlan], steps: int, clean: Callable[[str], str]
) -> list[StepResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err
    ) as progress:
        task = progress.add_task("maintenance", total=steps)

        def started(step: Any) -> None:
            progress.update(task, description=f"{step.table}: {step.procedure}")

        def done(result: StepResult) -> None:
            if result.error is not None:
                result.error = clean(result.error)  # Spark's messages may quote connection settings
            mark = Text("✓ ", style="green") if result.ok else Text("✗ ", style="red")
            progress.console.print(
                mark + Text(f"{result.step.table} {result.step.procedure} ({result.seconds:.1f}s) {_brief(result)}")
            )
            if result.step.note:
                # A silver table holding back bronze's expiry (a stalled or abandoned model) must not go unseen.
                progress.console.print(Text(f"  {result.step.note}", style="yellow"))
            if result.step.procedure != "check_offsets":
                progress.advance(task)

        return run_maintenance(spark, catalog, plans, on_start=started, on_done=done)


def _brief(result: StepResult) -> str:
    if not result.ok:
        return result.error or "failed"
    parts = [_item(key, value) for key, value in result.output.items() if value or key in _ALWAYS]
    return ", ".join(parts) or "nothing to do"


def _item(key: str, value: int) -> str:
    if key.endswith("_bytes_count"):
        return f"{key.removesuffix('_bytes_count').replace('_', ' ')} {_size(value)}"
    return f"{_SHORT.get(key, key)} {value:,}"


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _summary(results: list[StepResult]) -> Table:
    table = Table(title="maintenance", title_justify="left")
    table.add_column("table")
    table.add_column("procedure")
    table.add_column("result")
    table.add_column("time", justify="right")
    for result in results:
        table.add_row(
            result.step.table,
            result.step.procedure,
            Text(_brief(result), style="" if result.ok else "red"),
            f"{result.seconds:.1f}s",
        )
    return table


def _print_plan(out: Console, plans: list[TablePlan]) -> None:
    now = dt.datetime.now(dt.UTC)
    overview = Table(title=f"maintenance plan (dry run, {now:%Y-%m-%d %H:%M:%S}Z)", title_justify="left")
    for column in ("table", "snapshots", "would expire", "data files", "delete files"):
        overview.add_column(column, justify="left" if column == "table" else "right", overflow="fold")
    for plan in plans:
        overview.add_row(
            plan.table,
            f"{plan.snapshots:,}",
            f"{plan.expirable_snapshots:,}",
            f"{plan.data_files:,}",
            f"{plan.delete_files:,}",
        )
    out.print(overview)
    for plan in plans:
        for step in plan.steps:
            out.print(Text(step.sql + ";"), soft_wrap=True)
            if step.note:
                out.print(Text(f"  -- {step.note}", style="dim"), soft_wrap=True)
