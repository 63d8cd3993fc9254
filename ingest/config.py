"""cdclake.yml: one file, validated into typed settings, every key overridable from the environment.

Lookup order for the file: ``--config``, then ``CDCLAKE_CONFIG``, then ``./cdclake.yml``; without a file the
embedded defaults apply (SQLite catalog and warehouse under ``./lakehouse``).

Environment overrides use ``CDCLAKE__<SECTION>__<KEY>`` (``CDCLAKE__SOURCE__BOOTSTRAP_SERVERS=...``): a text
setting takes the value as written, a list or mapping setting a YAML one (``CDCLAKE__SOURCE__TOPICS='[a, b]'``;
a mapping's entries are added to the file's), and ``null`` unsets a setting that may be unset. Inside the
librdkafka ``consumer`` map, ``_`` stands for ``.`` (``CDCLAKE__SOURCE__CONSUMER__SASL_PASSWORD`` sets
``sasl.password``); the other maps (``spark.conf``, ``ingest.table_mapping``) are set whole, as YAML. Values may
also reference the environment as ``${VAR}`` so secrets stay out of the file. Errors name the variable at fault.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import quote, quote_plus, unquote

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ingest.errors import ConfigError

ENV_PREFIX = "CDCLAKE__"
CONFIG_ENV = "CDCLAKE_CONFIG"
DEFAULT_CONFIG_NAME = "cdclake.yml"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# librdkafka / catalog / storage keys whose values must never be printed (an Azure storage account's key:
# spark.hadoop.fs.azure.account.key.<account>..., adls.account-key; not fs.azure.account.keyprovider...).
SECRET_KEY_PATTERN = re.compile(
    r"(password|secret|token|credential|sasl\.jaas|private|account[._-]?key(?![a-z]))", re.IGNORECASE
)

# What becomes of PostgreSQL's infinity in date and timestamp columns (ingest.debezium.types applies it).
InfiniteTimestamps = Literal["dead_letter", "clamp"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The one cdclake installs; a bare postgresql:// is given it (SQLAlchemy 2.1 would take psycopg 3, not installed).
_POSTGRES_DRIVERS = frozenset({"psycopg2"})


class LakehouseSettings(_Section):
    """Where the Iceberg tables live. Spark, pyiceberg and dbt all derive their settings from this block."""

    warehouse: str = Field(default="lakehouse/warehouse", description="Warehouse path or URI for table data.")
    catalog_uri: SecretStr = Field(
        default=SecretStr("sqlite:///lakehouse/catalog.db"),
        description="pyiceberg SQL-catalog URI (SQLAlchemy form): sqlite:////abs/catalog.db or "
        "postgresql+psycopg2://user:password@host:5432/db. Spark gets the JDBC equivalent, with the "
        "connection parameters (?sslmode=, sslrootcert=, options=, ...) translated; one it cannot translate "
        "is an error. Only these two databases (PostgreSQL through psycopg2, which a bare postgresql:// gets too), "
        "and not an in-memory SQLite database, which Spark cannot share.",
    )
    storage: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="pyiceberg FileIO properties of the warehouse's storage, for the ingester, status and maintain: "
        "for S3, s3.endpoint, s3.access-key-id, s3.secret-access-key, s3.region (a warehouse on s3a:// or s3://). "
        "Spark takes its own, in spark.conf (spark.hadoop.fs.s3a.*). Values are secret: never printed.",
    )
    catalog_name: str = Field(
        default="lake",
        pattern=r"^[a-z_][a-z0-9_]*$",
        description="Iceberg catalog name; stored in the catalog, so Spark and pyiceberg must agree.",
    )
    bronze_namespace: str = Field(
        default="bronze", pattern=r"^[a-z_][a-z0-9_]*$", description="Namespace of the bronze tables."
    )
    silver_namespace: str = Field(
        default="silver", pattern=r"^[a-z_][a-z0-9_]*$", description="Namespace of the silver tables (dbt schema)."
    )

    @field_validator("catalog_uri")
    @classmethod
    def _uri_parses(cls, value: SecretStr) -> SecretStr:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        text = value.get_secret_value()
        try:
            url = make_url(text)
        except (ArgumentError, ValueError):
            # Without the text: it holds the password.
            raise ValueError(
                "not a valid SQLAlchemy URI (sqlite:////abs/catalog.db or "
                "postgresql+psycopg2://user:password@host:5432/db; the port must be a number)"
            ) from None
        # Messages below never quote the URI either. Names from the text: asking SQLAlchemy for the driver loads it.
        backend, _, driver = url.drivername.partition("+")
        if backend == "sqlite":
            if url.database in (None, "", ":memory:"):
                raise ValueError(
                    "an in-memory SQLite catalog is not shared with Spark and is lost when the process ends: "
                    "give a file (sqlite:////abs/catalog.db)"
                )
        elif backend == "postgresql":
            if driver and driver not in _POSTGRES_DRIVERS:
                raise ValueError(
                    f"PostgreSQL driver {driver!r} is not supported: use postgresql+psycopg2://user:password@host/db"
                )
            if text.partition("://")[2].split("/", 1)[0].count("@") > 1:
                raise ValueError(
                    "the part before the host holds more than one '@': percent-encode an '@' in the user name or "
                    "password as %40"
                )
            if not url.database:
                # libpq would connect to the database named after the user, Spark's JDBC driver to none: give the
                # one both use.
                raise ValueError(
                    "name the catalog's database after the host: postgresql+psycopg2://user:password@host:5432/db"
                )
        else:
            raise ValueError(
                f"catalog database {url.drivername!r} is not supported: use sqlite:////abs/catalog.db or "
                "postgresql+psycopg2://user:password@host:5432/db"
            )
        return value

    @model_validator(mode="after")
    def _namespaces_differ(self) -> LakehouseSettings:
        # A scaffolded model is named after its bronze table: in one namespace, silver would be bronze itself.
        if self.bronze_namespace == self.silver_namespace:
            raise ValueError(
                f"lakehouse.bronze_namespace and lakehouse.silver_namespace are both {self.bronze_namespace!r}: "
                "give them different names (silver tables are named after their bronze tables)"
            )
        return self


class SparkSettings(_Section):
    """Where Spark runs. The embedded default is local; a cluster is a master URL plus extra conf."""

    master: str = Field(
        default="local[2]", description="Spark master URL (local[N], spark://host:7077, yarn, k8s://...)."
    )
    driver_memory: str = Field(default="2g", description="spark.driver.memory of cdclake's Spark sessions.")
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings, passed through. The driver logs through spark_conf/log4j2.properties unless "
        "spark.driver.extraJavaOptions names a -Dlog4j2.configurationFile of its own, and maps the class-data sharing "
        "archive `make setup` wrote (a faster start) unless those options set class sharing themselves "
        "(-XX:SharedArchiveFile, -Xshare:off) or start a flight recording or an agent (-XX:StartFlightRecording, "
        "-javaagent:).",
    )


# An unescaped \d or \D, or a (?...) group: Python's, not in the POSIX extended regex (with GNU's \w, \s, \b)
# librdkafka subscribes with.
_NOT_POSIX = re.compile(r"(?<!\\)(?:\\\\)*(\\[dD]|\(\?)")
# librdkafka consumer settings whose other values break what bronze promises.
_RESETS = frozenset({"error", "earliest", "smallest", "beginning"})
_CONSUMER_REQUIRED: dict[str, frozenset[str]] = {
    "isolation.level": frozenset({"read_committed"}),
    "auto.offset.reset": _RESETS,
    "topic.auto.offset.reset": _RESETS,  # librdkafka takes topic settings with this prefix too
    "enable.partition.eof": frozenset({"true", "t", "1"}),  # librdkafka's spellings of true
}
_RESET_WHY = (
    "a partition whose bronze offset the log no longer holds would jump to its end, skipping every record not "
    "landed yet without a word: use error (the default) or earliest"
)
_CONSUMER_WHY = {
    "isolation.level": "records of aborted transactions would land in bronze (a Kafka Connect task with exactly-once "
    "source support aborts and sends its batch again): keep read_committed",
    "auto.offset.reset": _RESET_WHY,
    "topic.auto.offset.reset": _RESET_WHY,
    "enable.partition.eof": "cdclake learns that a partition is read to its end from these events (--once, lag)",
}


class SourceSettings(_Section):
    """Where change events come from: a Kafka cluster, or a topic dump in `kcat -C -J` JSON lines."""

    type: Literal["kafka", "file"] = Field(default="kafka", description="kafka, or file (a kcat -J topic dump).")
    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="Kafka bootstrap servers.")
    topics: list[str] = Field(
        default_factory=list, description="Debezium topics to follow (type=file: those of the dump; default all)."
    )
    topic_pattern: str | None = Field(
        default=None,
        description="Regex of topics to follow, matched from the name's start, e.g. '^dbserver1\\..*' (POSIX "
        "extended, as librdkafka matches it: [0-9], not \\d).",
    )
    group_id: str = Field(default="cdclake", description="Consumer group; group commits are advisory only.")
    consumer: dict[str, SecretStr] = Field(
        default_factory=dict,
        description=(
            "Any librdkafka consumer setting (security.protocol, sasl.*, ssl.*). cdclake sets auto.offset.reset to "
            "error: a partition whose bronze offset the topic no longer holds stops ingest; earliest accepts the gap. "
            "It also sets fetch.queue.backoff.ms to 10 (librdkafka: 1000), so that a reader catching up is not left "
            "waiting for its next fetch. Refused, since they break exactly-once: auto.offset.reset latest, "
            "isolation.level read_uncommitted, enable.partition.eof false."
        ),
    )
    path: str | None = Field(default=None, description="For type=file: the JSON-lines dump to read.")
    heartbeat_topic_prefixes: list[str] = Field(
        default_factory=list,
        description=(
            "Your connectors' topic.heartbeat.prefix values, besides Debezium's default __debezium-heartbeat: "
            "cdclake status does not list those topics as unlanded (ingest skips heartbeats by their content)."
        ),
    )
    poll_timeout_s: float = Field(default=1.0, gt=0, description="Longest wait for records in one poll.")

    @field_validator("topic_pattern")
    @classmethod
    def _pattern_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
            # librdkafka subscribes with a POSIX extended regex: \d would match no topic, a lookaround or inline
            # flag fails the subscription, and neither error names this setting.
            unsupported = _NOT_POSIX.search(value)
            if unsupported:
                raise ValueError(
                    f"`{unsupported.group(1)}` is not in the POSIX extended regex librdkafka matches topics with "
                    "(use [0-9] for \\d; no (?...) groups)"
                )
        return value

    @field_validator("heartbeat_topic_prefixes")
    @classmethod
    def _prefixes_are_names(cls, value: list[str]) -> list[str]:
        if any(not prefix.strip() for prefix in value):
            raise ValueError("an empty prefix would take every topic for a heartbeat topic")
        return value

    @field_validator("consumer")
    @classmethod
    def _consumer_keeps_exactly_once(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for key, allowed in _CONSUMER_REQUIRED.items():
            setting = value.get(key)
            if setting is not None and setting.get_secret_value().strip().lower() not in allowed:
                raise ValueError(f"{key}={setting.get_secret_value()!r}: {_CONSUMER_WHY[key]}")
        return value

    @model_validator(mode="after")
    def _source_is_complete(self) -> SourceSettings:
        if self.type == "file" and not self.path:
            raise ValueError("source.path is required when source.type is 'file'")
        if self.type == "kafka" and not (self.topics or self.topic_pattern):
            raise ValueError("source.topics or source.topic_pattern is required when source.type is 'kafka'")
        if self.type == "kafka" and not self.bootstrap_servers.strip(" ,"):
            raise ValueError("source.bootstrap_servers is empty: name at least one broker (host:port)")
        if self.topics and self.topic_pattern:
            raise ValueError("set source.topics or source.topic_pattern, not both")
        return self

    def consumer_config(self) -> dict[str, str]:
        """The librdkafka settings in clear text, for the client only. Never log this."""
        return {key: value.get_secret_value() for key, value in self.consumer.items()}


class IngestSettings(_Section):
    """How bronze is written: flush policy (IBM CDC's UOW latency threshold), naming, service endpoints."""

    max_records: int = Field(default=100_000, ge=1, description="Flush when this many records are buffered.")
    max_bytes: int = Field(default=128 * 1024 * 1024, ge=1024, description="Flush when buffered bytes exceed this.")
    latency_threshold_s: float = Field(
        default=10.0, gt=0, description="Flush at the latest this many seconds after the first buffered record."
    )
    writer_threads: int = Field(default=2, ge=1, le=64, description="Tables committed in parallel per flush.")
    background_commit: bool = Field(
        default=True,
        description="Commit a full buffer in a background thread while the next one fills (one commit in flight at "
        "most, so up to twice max_records / max_bytes are held).",
    )
    background_decode: bool = Field(
        default=True,
        description="Decode polls (JSON parse and typing, fast path) in a background thread while the next ones are "
        "read: up to 3 wait to be buffered, in order, and count against max_records / max_bytes; all are buffered "
        "before a flush or a rebalance, so the result is the same as without.",
    )
    table_mapping: dict[str, str] = Field(
        default_factory=dict, description="Topic -> bronze table name overrides (name without namespace)."
    )
    commit_attempts: int = Field(default=8, ge=1, description="Tries per table commit before the service stops.")
    on_type_conflict: Literal["dead_letter", "fail"] = Field(
        default="fail",
        description="A column whose type changes in a way that cannot widen: stop, naming the record, table, column "
        "and both types (as a Kafka Connect sink fails its task), or dead-letter the record and every later one of "
        "that type, which silver then never sees.",
    )
    variable_scale_decimal_scale: int = Field(
        default=10, ge=0, le=38, description="Scale of the decimal(38, s) column for VariableScaleDecimal values."
    )
    infinite_timestamps: InfiniteTimestamps = Field(
        default="dead_letter",
        description="PostgreSQL's 'infinity' and '-infinity' in date and timestamp columns (Debezium's sentinel "
        "values): dead-letter the record, as any value outside years 1-9999, or land them as the last and first "
        "instants Spark reads (9999-12-31T23:59:59.999999 and 0001-01-01T00:00:00; dates 9999-12-31 and "
        "0001-01-01), which then stand for both the sentinel and that very value.",
    )
    metrics_port: int | None = Field(default=None, ge=0, le=65535, description="Serve /metrics and /healthz here.")
    unhealthy_after_s: float = Field(
        default=60.0,
        gt=0,
        description="/healthz fails after this long without progress; `--once` gives up (exit status 2) on a Kafka "
        "cluster no broker of which answered for this long.",
    )
    skip_heartbeats: bool = Field(default=True, description="Skip Debezium heartbeat topics' records.")

    @field_validator("table_mapping")
    @classmethod
    def _mapped_names_are_identifiers(cls, value: dict[str, str]) -> dict[str, str]:
        for topic, name in value.items():
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
                raise ValueError(f"table name {name!r} for topic {topic!r} must match [a-z_][a-z0-9_]*")
            if name.startswith("_cdc_"):
                raise ValueError(f"table name {name!r} for topic {topic!r}: names starting _cdc_ are cdclake's own")
        return value


class LayerMaintenance(_Section):
    """Upkeep settings of one layer."""

    expire_older_than_hours: float = Field(
        default=72.0, ge=0, description="Expire snapshots older than this (time travel window)."
    )
    retain_last: int = Field(default=10, ge=1, description="Always keep this many most recent snapshots.")
    orphan_older_than_hours: float = Field(
        default=72.0,
        ge=24,
        description="Delete unreferenced files older than this; must exceed the longest write (Iceberg: >= 24).",
    )
    min_input_files: int = Field(default=2, ge=1, description="Compact a partition once it has this many files.")
    delete_file_threshold: int | None = Field(
        default=None,
        ge=1,
        description="Also rewrite a data file with at least this many delete files (none: only small files).",
    )


class SilverMaintenance(LayerMaintenance):
    """Upkeep settings of silver, whose MERGE and DELETE leave position deletes: its data files with one are
    rewritten by default (a field default, so that setting another key of the section keeps it)."""

    delete_file_threshold: int | None = Field(
        default=1,
        ge=1,
        description="Also rewrite a data file with at least this many delete files (silver's DELETEs leave them).",
    )


class MaintenanceSettings(_Section):
    """``maintenance:`` in cdclake.yml (bronze and silver upkeep)."""

    bronze: LayerMaintenance = Field(default_factory=LayerMaintenance)
    silver: SilverMaintenance = Field(default_factory=SilverMaintenance)
    keep_silver_position: bool = Field(
        default=True,
        description="Never expire the bronze snapshot a silver table has applied (its incremental start point).",
    )

    def layer(self, layer: Literal["bronze", "silver"]) -> LayerMaintenance:
        return self.bronze if layer == "bronze" else self.silver


class DbtSettings(_Section):
    project_dir: str = Field(default="dbt_project", description="dbt project used by `cdclake dbt` and scaffold.")
    target: Literal["session", "cluster"] = Field(
        default="session", description="dbt target of the generated profile: session (in-process Spark) or cluster."
    )
    thrift_host: str | None = Field(
        default=None,
        description="Spark Thrift Server host: when set, the profile gets a `cluster` target (dbt-spark thrift).",
    )
    thrift_port: int = Field(default=10000, ge=1, le=65535, description="Spark Thrift Server port (target cluster).")

    @model_validator(mode="after")
    def _cluster_target_has_a_server(self) -> DbtSettings:
        if self.target == "cluster" and not self.thrift_host:
            raise ValueError("dbt.target 'cluster' needs dbt.thrift_host (the Spark Thrift Server)")
        return self


class Settings(_Section):
    lakehouse: LakehouseSettings = Field(default_factory=LakehouseSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    source: Annotated[SourceSettings | None, Field(default=None)] = None
    ingest: IngestSettings = Field(default_factory=IngestSettings)
    dbt: DbtSettings = Field(default_factory=DbtSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    # Directory relative paths are resolved against (the config file's folder, or the working directory).
    base_dir: str = Field(default=".", exclude=True)

    def resolve(self, path: str) -> Path:
        candidate = Path(path)
        return candidate if candidate.is_absolute() else (Path(self.base_dir) / candidate).resolve()

    def require_source(self) -> SourceSettings:
        if self.source is None:
            raise ConfigError("source: no source configured (set source.type and its settings in cdclake.yml)")
        return self.source


def _interpolate(value: Any, where: str, environ: dict[str, str]) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in environ:
                raise ConfigError(f"{where}: environment variable {name} is referenced but not set")
            return environ[name]

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, dict):
        return {key: _interpolate(item, f"{where}.{key}", environ) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, f"{where}[{index}]", environ) for index, item in enumerate(value)]
    return value


def _apply_env_overrides(raw: dict[str, Any], environ: dict[str, str]) -> dict[tuple[str, ...], str]:
    """Apply the ``CDCLAKE__<SECTION>__<KEY>`` variables to ``raw``; returns which variable set which key."""
    origins: dict[tuple[str, ...], str] = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].split("__")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"{name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
        path = [part.lower() for part in parts]
        # The librdkafka map keeps dotted keys (environment names cannot hold dots); its values are strings.
        librdkafka = path[:2] == ["source", "consumer"] and len(path) == 3
        target = _setting_at(path)
        if target is not None and target.map_entry and not librdkafka:
            whole = "__".join(parts[: target.map_depth])
            raise ConfigError(
                f"{name}: the keys of {'.'.join(path[: target.map_depth])} (Spark settings, topic names: dotted, mixed "
                "case) cannot be spelled in a variable name; set its entries as a YAML mapping instead: "
                f"{ENV_PREFIX}{whole}='{{key: value}}' (they are added to the file's)"
            )
        node = raw
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {key} is not a section")
        last = path[-1].replace("_", ".") if librdkafka else path[-1]
        if librdkafka or SECRET_KEY_PATTERN.search(last):
            converted: Any = value  # a secret is never parsed: an error message could show it
        else:
            converted = _env_value(name, value, target)
        if isinstance(converted, dict) and isinstance(node.get(last), dict):
            converted = {**node[last], **converted}
        node[last] = converted
        origins[(*path[:-1], last)] = name
    return origins


@dataclass(frozen=True)
class _Target:
    """What the environment sets: a setting of this type, possibly None, or an entry of a map (spark.conf...)."""

    annotation: Any
    nullable: bool
    map_entry: bool
    map_depth: int  # with map_entry: how many path parts name the map itself


def _setting_at(path: list[str]) -> _Target | None:
    """The setting ``path`` (lowercase keys) names; None for a key the settings do not have (validation says so)."""
    annotation: Any = Settings
    nullable = map_entry = False
    map_depth = 0
    for depth, key in enumerate(path):
        annotation, nullable = _without_none(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(key)
            if field is None:
                return None
            annotation = field.annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
            if not map_entry:
                map_entry, map_depth = True, depth
        else:
            return None
    annotation, nullable = _without_none(annotation)
    return _Target(annotation, nullable, map_entry, map_depth)


def _without_none(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in (Union, UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return members[0], len(members) < len(get_args(annotation))
    return annotation, False


def _env_value(name: str, value: str, target: _Target | None) -> Any:
    """An override's value: the text as it is for a text setting (``[::1]:9092``, a regex ``[ab].*``); for a list
    or mapping setting YAML (``[a, b]``); ``null`` (or nothing) unsets a setting that may be unset (``metrics_port``).
    The error names the variable only: its value may be a secret."""
    if target is not None and target.nullable and value.strip().lower() in ("", "null", "~"):
        return None
    if target is not None and target.annotation in (str, SecretStr):
        return value
    if value.strip()[:1] not in ("[", "{"):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        raise ConfigError(f"{name}: starts like a YAML list or mapping but is not valid YAML") from None


def find_config_file(
    explicit: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None
) -> Path | None:
    env = os.environ if environ is None else environ
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"--config {path}: file not found")
        return path
    from_env = env.get(CONFIG_ENV)
    if from_env:
        path = Path(from_env)
        if not path.is_file():
            raise ConfigError(f"{CONFIG_ENV}={path}: file not found")
        return path
    default = Path(DEFAULT_CONFIG_NAME)
    return default if default.is_file() else None


def load_settings(path: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Read, interpolate, override from the environment and validate. Errors name the offending key."""
    env = dict(os.environ if environ is None else environ)
    config_file = find_config_file(path, env)
    raw: dict[str, Any] = {}
    base_dir = Path.cwd()
    if config_file is not None:
        try:
            loaded = yaml.safe_load(config_file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{config_file}: not valid YAML: {_yaml_problem(exc)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{config_file}: the top level must be a mapping")
        raw = _interpolate(loaded, str(config_file), env)
        base_dir = config_file.resolve().parent
    origins = _apply_env_overrides(raw, env)
    raw["base_dir"] = str(base_dir)
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_problem(error["loc"], error["msg"], origins) for error in exc.errors())
        origin = str(config_file) if config_file else "configuration"
        raise ConfigError(f"{origin}: {problems}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without PyYAML's quote of the line: the line may hold a secret (a password with a
    character YAML reads as syntax)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return type(exc).__name__
    mark = exc.problem_mark or exc.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    # The scanner's and the parser's problems name characters and token kinds; the composer's and the
    # constructor's quote the text (an alias, a tag), which may be the secret itself.
    if isinstance(exc, yaml.scanner.ScannerError | yaml.parser.ParserError):
        return f"{' '.join(part for part in (exc.context, exc.problem) if part)}{where}"
    return f"{type(exc).__name__}{where}"


def _problem(loc: tuple[int | str, ...], message: str, origins: dict[tuple[str, ...], str]) -> str:
    """One validation error, naming the key and, when the environment set it, the variable."""
    key = tuple(str(part) for part in loc)
    where = ".".join(key) or "<root>"
    # The variable that set this key or a section around it; else those that set keys inside it (a misspelt
    # section, a section made invalid), which may or may not be at fault.
    variable = next((origins[key[:length]] for length in range(len(key), 0, -1) if key[:length] in origins), None)
    if variable:
        return f"{where} (set by {variable}): {message}"
    inside = sorted(name for path, name in origins.items() if key and path[: len(key)] == key)
    return f"{where} (the environment sets {', '.join(inside)} in it): {message}" if inside else f"{where}: {message}"


def uri_secrets(uri: str) -> list[str]:
    """The password of a URI's user info and the values of its secret-named query parameters (``sslpassword``)."""
    found = []
    user_password = re.search(r"://[^:/@?]*:([^@]+)@", uri)
    if user_password:
        found.append(user_password.group(1))
    for name, value in re.findall(r"[?&;]([^=&;?]+)=([^&;]*)", uri):
        if SECRET_KEY_PATTERN.search(name):
            found.append(value)
    return found


def redact(text: str, settings: Settings) -> str:
    """Remove every configured secret from a message before it is logged or shown: librdkafka secrets, the catalog
    URI's password and secret parameters, every lakehouse.storage value, and Spark settings that hold a secret (or
    a URL with one)."""
    consumer = settings.source.consumer if settings.source else {}
    secrets = [value.get_secret_value() for key, value in consumer.items() if SECRET_KEY_PATTERN.search(key)]
    secrets += uri_secrets(settings.lakehouse.catalog_uri.get_secret_value())
    # Every storage property counts (documented as secret, whatever its name: adls.account-key, a new FileIO
    # property), but a switch or a number (s3.path-style-access: true would hide every "true").
    storage = [value.get_secret_value() for value in settings.lakehouse.storage.values()]
    secrets += [value for value in storage if not _plain(value)]
    for key, value in settings.spark.conf.items():
        # A switch or a number is no secret (spark.security.credentials.hive.enabled: false would hide every "false").
        plain = _plain(value)
        secrets += [value] if SECRET_KEY_PATTERN.search(key) and not plain else uri_secrets(value)
    # As written, as the drivers use them (percent-decoded), and percent-encoded again (Spark's JDBC URL).
    candidates = {
        form
        for secret in secrets
        for plain in (secret, unquote(secret))
        for form in (plain, quote_plus(plain), quote(plain, safe=""))
    }
    for secret in sorted({s for s in candidates if len(s) >= 4}, key=len, reverse=True):
        # A numeric password: not inside a longer number (a row count, an offset).
        digits = secret.isdigit()
        text = re.sub(rf"(?<![0-9]){secret}(?![0-9])", "***", text) if digits else text.replace(secret, "***")
    return text


def _plain(value: str) -> bool:
    return value.lower() in ("true", "false") or value.isdigit()


def redact_values(document: Any, settings: Settings) -> Any:
    """``document`` (JSON-like: dicts, lists, scalars) with every configured secret removed from its strings;
    numbers stay numbers (redacting its serialized text could make a number into `***` and the JSON invalid)."""
    if isinstance(document, str):
        return redact(document, settings)
    if isinstance(document, dict):
        return {key: redact_values(value, settings) for key, value in document.items()}
    if isinstance(document, list | tuple):
        return [redact_values(value, settings) for value in document]
    return document
