"""`cdclake sql`: Spark SQL on the lakehouse, as a one-shot command or an interactive prompt.

``cdclake sql "SELECT ..."`` prints a table; ``--format csv|json|jsonl`` prints just the data on stdout for scripts.
Without a query it reads statements (ended by ``;``) from a prompt with history (``~/.cdclake_history``), or from
stdin when stdin is not a terminal (``cdclake sql < script.sql``). A failing statement prints one line and exits
with code 1 (the prompt just continues).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import datetime as dt
import decimal
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import click
import orjson

from ingest.cli.common import config_option, settings_from
from ingest.config import Settings, redact
from ingest.errors import CdclakeError
from ingest.maintenance import spark_error_line

FORMATS = ("table", "csv", "json", "jsonl")
DEFAULT_TABLE_ROWS = 1000
HISTORY_FILE = ".cdclake_history"
HISTORY_LENGTH = 2000
PROMPT = "cdclake> "
CONTINUATION = "    ...> "
QUIT_WORDS = frozenset({"exit", "quit", "\\q"})


# -- statements ------------------------------------------------------------------------------------------------------
def split_statements(text: str) -> tuple[list[str], str]:
    """Complete ``;``-terminated statements of ``text`` and the unfinished rest.

    Semicolons inside quotes ('...', "...", `...`; in raw strings r'...' a backslash escapes nothing), ``--`` line
    comments and ``/* */`` comments (which nest, as in Spark SQL) do not end a statement. Returned statements are
    stripped and non-empty, without their ``;``.
    """
    statements: list[str] = []
    start = 0
    i = 0
    quote: str | None = None
    raw = False
    n = len(text)
    while i < n:
        char = text[i]
        if quote is not None:
            if char == "\\" and quote != "`" and not raw:
                i += 2
                continue
            if char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
            raw = char != "`" and i > 0 and text[i - 1] in "rR" and not (i > 1 and _word_char(text[i - 2]))
        elif text.startswith("--", i):
            end = text.find("\n", i)
            if end < 0:
                break
            i = end
        elif text.startswith("/*", i):
            end = _comment_end(text, i)
            if end < 0:
                break
            i = end - 1
        elif char == ";":
            statement = text[start:i].strip()
            if _has_code(statement):
                statements.append(statement)
            start = i + 1
        i += 1
    rest = text[start:]
    return statements, rest if _has_code(rest) else ""


def _word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _comment_end(text: str, start: int) -> int:
    """Where the ``/* */`` comment at ``start`` ends (just past its ``*/``; comments nest), or -1 if it does not."""
    depth = 0
    i = start
    while i < len(text):
        if text.startswith("/*", i):
            depth += 1
            i += 2
        elif text.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return -1


def _has_code(text: str) -> bool:
    """False for text that is only whitespace and comments."""
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            end = _comment_end(text, i)
            i = n if end < 0 else end
        else:
            return True
    return False


def all_statements(text: str) -> list[str]:
    """Every statement of a script; the last may omit its ``;``."""
    statements, rest = split_statements(text)
    if rest.strip():
        statements.append(rest.strip())
    return statements


# -- values ------------------------------------------------------------------------------------------------------------
def _is_row(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "asDict")


def jsonable(value: Any) -> Any:
    """A Spark value as JSON: structs as objects, decimals as strings (no precision lost), binary as base64."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if _is_row(value):
        return {key: jsonable(item) for key, item in value.asDict().items()}
    if isinstance(value, dict):
        return {str(jsonable(key)): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def text_value(value: Any) -> str:
    """A Spark value as one cell of text (csv, table): nested values as compact JSON, NULL as empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime | dt.date | dt.time | decimal.Decimal | int | float):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return orjson.dumps(jsonable(value)).decode()


# -- results -----------------------------------------------------------------------------------------------------------
@dataclass
class Result:
    columns: list[str]
    numeric: list[bool]
    rows: Iterable[Any]
    truncated_at: int | None = None  # table format: more rows exist than were fetched


_NUMERIC_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "DecimalType")


def execute(spark: Any, statement: str, max_rows: int | None) -> Result:
    """Run one statement; rows are fetched lazily (all of them when ``max_rows`` is None)."""
    frame = spark.sql(statement)
    fields = list(frame.schema.fields)
    columns = [f.name for f in fields]
    numeric = [type(f.dataType).__name__ in _NUMERIC_TYPES for f in fields]
    if not columns:
        return Result([], [], [])
    if max_rows is None:
        return Result(columns, numeric, frame.toLocalIterator())
    rows = frame.take(max_rows + 1)
    if len(rows) > max_rows:
        return Result(columns, numeric, rows[:max_rows], truncated_at=max_rows)
    return Result(columns, numeric, rows)


def write_csv(result: Result, out: TextIO) -> int:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(result.columns)
    count = 0
    for row in result.rows:
        writer.writerow([text_value(value) for value in row])
        count += 1
    return count


def _json_row(result: Result, row: Any) -> bytes:
    return orjson.dumps({column: jsonable(value) for column, value in zip(result.columns, row, strict=True)})


def write_json(result: Result, out: TextIO, lines: bool) -> int:
    count = 0
    if lines:
        for row in result.rows:
            out.write(_json_row(result, row).decode() + "\n")
            count += 1
        return count
    out.write("[")
    for row in result.rows:
        out.write(("\n  " if count == 0 else ",\n  ") + _json_row(result, row).decode())
        count += 1
    out.write("\n]\n" if count else "]\n")
    return count


def write_table(result: Result, out: TextIO, started: float) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out, soft_wrap=False)
    rows = list(result.rows)
    table = Table(show_lines=False, header_style="bold")
    for column, numeric in zip(result.columns, result.numeric, strict=True):
        table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*[Text("NULL", style="dim") if value is None else Text(text_value(value)) for value in row])
    console.print(table)
    footer = f"{len(rows):,} row{'s' if len(rows) != 1 else ''} ({time.monotonic() - started:.2f}s)"
    if result.truncated_at is not None:
        footer += f"; showing the first {result.truncated_at:,}, use --max-rows to see more"
    console.print(Text(footer, style="dim"))
    return len(rows)


# -- the command -------------------------------------------------------------------------------------------------------
class SqlRunner:
    """Runs statements on one SparkSession (started on first use) and prints results in one format."""

    def __init__(self, settings: Settings, fmt: str, max_rows: int | None) -> None:
        self.settings = settings
        self.fmt = fmt
        self.max_rows = max_rows if max_rows is not None else (DEFAULT_TABLE_ROWS if fmt == "table" else None)
        if self.max_rows == 0:
            self.max_rows = None
        self._spark: Any = None

    @property
    def spark(self) -> Any:
        if self._spark is None:
            from ingest.spark import spark_session

            if sys.stderr.isatty():
                from rich.console import Console

                with Console(stderr=True).status("starting Spark"):
                    self._spark = spark_session(self.settings)
            else:
                self._spark = spark_session(self.settings)
        return self._spark

    def run(self, statement: str) -> None:
        spark = self.spark  # started on first use; not part of the statement's time
        started = time.monotonic()
        out = sys.stdout
        try:
            result = execute(spark, statement, self.max_rows)
            if not result.columns:
                if self.fmt == "table":
                    click.secho(f"OK ({time.monotonic() - started:.2f}s)", dim=True, err=True)
                return
            if self.fmt == "csv":
                write_csv(result, out)
            elif self.fmt in ("json", "jsonl"):
                write_json(result, out, lines=self.fmt == "jsonl")
            else:
                write_table(result, out, started)
            out.flush()
        except ValueError as exc:
            if not _YEAR_OUT_OF_RANGE.fullmatch(str(exc)):
                raise
            # pyspark makes a timestamp a Python datetime through the local time of its instant, which CPython
            # cannot do within a day of years 1 and 9999 (0001-01-01T00:00:00Z: PostgreSQL's -infinity clamped).
            raise ValueError(
                f"{exc}: a timestamp of the result is too close to year 1 or 9999 for Python; "
                "select it as text (cast(... as string))"
            ) from None
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                self.spark.sparkContext.cancelAllJobs()
            raise

    def error_line(self, error: BaseException) -> str:
        return redact(spark_error_line(error), self.settings)


_YEAR_OUT_OF_RANGE = re.compile(r"year -?[0-9]+ is out of range")


def repl(
    run: Callable[[str], None],
    read: Callable[[str], str],
    on_error: Callable[[BaseException], None],
    write: Callable[[str], None],
) -> None:
    """Read statements until ``exit``/``quit`` or end of input; each complete statement runs as soon as it ends.

    Ctrl-C discards the statement being typed (or cancels the running one); errors are reported and the prompt
    continues.
    """
    buffer = ""
    while True:
        try:
            line = read(CONTINUATION if buffer else PROMPT)
        except EOFError:
            write("\n")
            return
        except KeyboardInterrupt:
            write("^C\n")
            buffer = ""
            continue
        if not buffer and line.strip().rstrip(";").strip().lower() in QUIT_WORDS:
            return
        statements, buffer = split_statements(buffer + line + "\n")
        for statement in statements:
            try:
                run(statement)
            except KeyboardInterrupt:
                write("cancelled\n")
            except Exception as exc:
                on_error(exc)


@contextlib.contextmanager
def _history(path: Path) -> Iterator[None]:
    import readline

    readline.set_history_length(HISTORY_LENGTH)
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            readline.write_history_file(path)


class _SqlCommand(click.Command):
    """Takes a QUERY that starts with ``-`` (``cdclake sql "-- daily counts\nSELECT 1"``) as the query, where
    click would look for an option of that name: an argument that starts with ``-``, names none of the command's
    options and holds whitespace is moved behind ``--``. ``cdclake sql -- "..."`` works too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        names = {name for param in self.get_params(ctx) for name in (*param.opts, *param.secondary_opts)}
        with_value = {
            name
            for param in self.get_params(ctx)
            if isinstance(param, click.Option) and not param.is_flag and not param.count
            for name in param.opts
        }
        kept: list[str] = []
        queries: list[str] = []
        rest = list(args)
        while rest:
            arg = rest.pop(0)
            if arg == "--":
                kept += [arg, *rest]
                break
            if arg in with_value and rest:  # the option's value, whatever it looks like
                kept += [arg, rest.pop(0)]
            elif arg.startswith("-") and arg.split("=", 1)[0] not in names and any(c.isspace() for c in arg):
                queries.append(arg)
            else:
                kept.append(arg)
        if queries:
            kept = [*kept, *queries] if "--" in kept else [*kept, "--", *queries]
        return super().parse_args(ctx, kept)


@click.command(cls=_SqlCommand)
@config_option
@click.argument("query", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="table for people; csv, json (an array) or jsonl for scripts (data only on stdout).",
)
@click.option(
    "--max-rows",
    type=click.IntRange(min=0),
    default=None,
    help=f"Rows fetched per query (0: all). Default: {DEFAULT_TABLE_ROWS} for table, all for csv/json.",
)
@click.pass_context
def sql(ctx: click.Context, query: str | None, fmt: str, max_rows: int | None) -> None:
    """Run Spark SQL on the lakehouse (QUERY, or a prompt / stdin script when omitted).

    A QUERY may start with a comment (cdclake sql "-- daily counts ..."); `cdclake sql -- QUERY` always takes
    QUERY as the query.
    """
    settings = settings_from(ctx)
    runner = SqlRunner(settings, fmt, max_rows)

    def fail(error: BaseException) -> None:
        click.secho(f"error: {runner.error_line(error)}", fg="red", err=True)

    if query is not None or not sys.stdin.isatty():
        text = query if query is not None else sys.stdin.read()
        statements = all_statements(text)
        if not statements:
            raise click.UsageError("no SQL statement given")
        for statement in statements:
            try:
                runner.run(statement)
            except CdclakeError:
                raise  # a setting that keeps Spark from starting: cdclake's error (exit 2), not the statement's
            except Exception as exc:  # as at the prompt: one line, whatever failed (Spark, or printing the result)
                fail(exc)
                ctx.exit(1)
        return

    runner.spark  # noqa: B018 - start Spark before the first prompt
    click.echo("cdclake SQL (Spark). End statements with ';'. exit or Ctrl-D quits.", err=True)
    with _history(Path.home() / HISTORY_FILE):
        repl(runner.run, input, fail, lambda text: click.echo(text, nl=False, err=True))
