"""`cdclake replay-dead-letters`: land the dead letters that decode now (after a fix) in their bronze tables."""

from __future__ import annotations

import click

from ingest.cli.common import config_option, settings_from


@click.command("replay-dead-letters")
@config_option
@click.option("--topic", "topics", multiple=True, help="Only this topic's dead letters (repeatable; default: all).")
@click.option("--dry-run", is_flag=True, help="Decode and check them only: say what would land, commit nothing.")
@click.pass_context
def replay_dead_letters(ctx: click.Context, topics: tuple[str, ...], dry_run: bool) -> int:
    """Decode the dead letters again with the current settings; land those that decode now, exactly once."""
    from ingest.bronze.tables import BronzeTables
    from ingest.lakehouse import load_catalog
    from ingest.replay import replay_dead_letters as replay

    settings = settings_from(ctx)
    tables = BronzeTables(load_catalog(settings, create=False), settings.lakehouse.bronze_namespace)
    result = replay(settings, tables, topics, dry_run=dry_run)
    if not result.topics:
        click.echo("no dead letters" + (f" of {', '.join(topics)}" if topics else ""))
        return 0
    for topic, counts in sorted(result.topics.items()):
        parts = [
            f"{counts.landed:,} {'would land' if dry_run else 'landed'}",
            f"{counts.still_dead:,} still dead letters",
        ]
        if counts.waiting:
            parts.append(f"{counts.waiting:,} wait: their partition has not landed the records before them yet")
        if counts.mapped_elsewhere:
            parts.append(f"{counts.mapped_elsewhere:,} left: ingest.table_mapping sends the topic to another table now")
        click.echo(f"{topic}: {', '.join(parts)}")
    if dry_run:
        click.echo("dry run: nothing was committed")
    if any(counts.still_dead for counts in result.topics.values()):
        click.echo("the log names why each still fails; `cdclake status` shows the latest reason per topic")
    return 0
