"""One lakehouse, three clients: pyiceberg (ingest), Spark (silver, `cdclake sql`) and dbt (via the profile).

Everything each client needs is derived here from ``lakehouse:`` and ``spark:`` in cdclake.yml plus the static
settings in ``spark_conf/embedded.conf``, so nobody writes a catalog URI or a jar path twice.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.engine import URL, make_url

from ingest.config import SECRET_KEY_PATTERN, Settings, redact, uri_secrets
from ingest.errors import CatalogUnavailableError, ConfigError, SetupError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The shipped Spark settings every lakehouse starts from, before the derived ones and cdclake.yml's (spark_conf).
EMBEDDED_SPARK_CONF = PROJECT_ROOT / "spark_conf" / "embedded.conf"
RUNTIME_DIR_ENV = "CDCLAKE_RUNTIME_DIR"


def runtime_dir() -> Path:
    """Where setup assembled jars and binaries (ignored by git): ``.cdclake/`` in the project by default."""
    return Path(os.environ.get(RUNTIME_DIR_ENV, PROJECT_ROOT / ".cdclake"))


def spark_jars() -> list[str]:
    classpath = runtime_dir() / "jars" / "classpath.txt"
    if not classpath.is_file():
        raise SetupError(f"{classpath} is missing: run `make setup` to assemble the Iceberg runtime jars")
    return [jar for jar in classpath.read_text().strip().split(",") if jar]


def warehouse_uri(settings: Settings) -> str:
    warehouse = settings.lakehouse.warehouse
    if "://" in warehouse:
        return warehouse
    return settings.resolve(warehouse).as_uri()


def pyiceberg_uri(settings: Settings) -> str:
    """The SQLAlchemy URI, with a relative SQLite path made absolute against the config file's folder."""
    uri = settings.lakehouse.catalog_uri.get_secret_value()
    url = make_url(uri)
    if url.drivername == "postgresql":  # SQLAlchemy 2.1's default driver is psycopg 3; cdclake installs psycopg2
        return url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    database = sqlite_catalog_file(settings)
    if database is None:
        return uri
    _make_folder(database.parent, "lakehouse.catalog_uri", "the SQLite catalog's folder")
    return uri if Path(str(url.database)).is_absolute() else f"sqlite:///{database}"


def sqlite_catalog_file(settings: Settings) -> Path | None:
    """The SQLite catalog's database file (None for a PostgreSQL catalog); a relative path is taken against the
    config file's folder."""
    url = make_url(settings.lakehouse.catalog_uri.get_secret_value())
    if url.get_backend_name() != "sqlite" or not url.database:
        return None
    return Path(url.database) if Path(url.database).is_absolute() else settings.resolve(url.database)


def require_catalog_file(settings: Settings) -> None:
    """Refuse a SQLite catalog whose database file does not exist: opening it would create an empty catalog (a
    mistyped path), and every command but ``ingest`` and ``demo`` (which create it) only reads or changes what was
    landed. Call it before the catalog is opened (and before Spark starts on it)."""
    catalog_file = sqlite_catalog_file(settings)
    if catalog_file is not None and not catalog_file.exists():
        raise ConfigError(
            f"lakehouse.catalog_uri: no catalog database at {catalog_file}: nothing has been landed with this "
            "configuration yet, or the path is mistyped"
        )


def _make_folder(path: Path, setting: str, what: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot create {what} {path}: {exc.strerror or exc}") from None


def catalog_properties(settings: Settings) -> dict[str, str]:
    warehouse = warehouse_uri(settings)
    if warehouse.startswith("file:"):
        _make_folder(Path(warehouse.removeprefix("file://")), "lakehouse.warehouse", "the warehouse folder")
    storage = {key: value.get_secret_value() for key, value in settings.lakehouse.storage.items()}
    return {**storage, "uri": pyiceberg_uri(settings), "warehouse": warehouse}


def load_catalog(settings: Settings, *, create: bool = True) -> Any:
    """The pyiceberg SQL catalog; it creates the catalog tables on first use (Spark must not: see below).
    ``create=False``: a SQLite catalog file that does not exist is an error (:func:`require_catalog_file`)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.exc import DBAPIError

    from ingest import pyiceberg_repairs

    if not create:
        require_catalog_file(settings)

    pyiceberg_repairs.apply()

    properties = catalog_properties(settings)
    for attempt in range(1, 4):
        try:
            return SqlCatalog(settings.lakehouse.catalog_name, **properties)
        except DBAPIError as exc:
            # Several processes starting at once on a new catalog all try to create its tables; the
            # losers fail with a unique violation (pg_type) or "already exists" and find the winner's tables on the
            # next try. Anything else (refused, a bad connection parameter, not a database) is no race.
            if not _creation_race(exc) or attempt == 3:
                raise _unavailable(exc, settings) from None
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def check_catalog_reachable(settings: Settings) -> None:
    """Open the catalog database once, as pyiceberg does, and close it: a command about to start Spark on the
    catalog fails at once with one line naming the setting, not after the JVM's start with a Java stack trace."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    require_catalog_file(settings)  # connecting would create an empty catalog at a mistyped path
    engine = create_engine(pyiceberg_uri(settings))
    try:
        with engine.connect() as connection:
            # SQLite reads the file only at a query that needs it: is it a database at all?
            sqlite = connection.dialect.name == "sqlite"
            connection.execute(text("PRAGMA schema_version" if sqlite else "SELECT 1"))
    except DBAPIError as exc:
        raise _unavailable(exc, settings) from None
    finally:
        engine.dispose()


# PostgreSQL's SQLSTATEs of a concurrent CREATE TABLE: unique_violation (pg_type), duplicate_table,
# duplicate_object.
_RACE_SQLSTATES = frozenset({"23505", "42P07", "42710"})


def _creation_race(exc: Any) -> bool:
    """Whether ``exc`` is another process creating the catalog tables at the same time (worth a retry)."""
    from sqlalchemy.exc import IntegrityError

    sqlstate = getattr(exc.orig, "pgcode", None)
    if sqlstate is not None:
        return sqlstate in _RACE_SQLSTATES
    # SQLite says "table iceberg_tables already exists" as an OperationalError.
    return isinstance(exc, IntegrityError) or "already exists" in str(exc.orig)


def _unavailable(exc: Any, settings: Settings) -> CatalogUnavailableError:
    """The driver's own words (host unknown, refused, authentication), first line only, secrets removed."""
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
    return CatalogUnavailableError(
        f"lakehouse.catalog_uri: cannot open the Iceberg catalog database: {redact(reason, settings)}"
    )


def jdbc_catalog_conf(settings: Settings) -> dict[str, str]:
    """Spark's view of the same JDBC catalog."""
    url = make_url(pyiceberg_uri(settings))
    backend = url.get_backend_name()
    prefix = f"spark.sql.catalog.{settings.lakehouse.catalog_name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.warehouse": warehouse_uri(settings),
        # Iceberg leaves a metadata ResultSet open while creating catalog tables; on SQLite that lock lasts the
        # JVM's lifetime and every pyiceberg commit then fails with "database is locked". pyiceberg creates them.
        f"{prefix}.jdbc.init-catalog-tables": "false",
        f"{prefix}.jdbc.schema-version": "V1",
        # Without this a long-lived session never sees the ingester's commits.
        f"{prefix}.cache-enabled": "false",
    }
    if backend == "sqlite":
        conf[f"{prefix}.uri"] = f"jdbc:sqlite:{url.database}"
    elif backend == "postgresql":
        conf[f"{prefix}.uri"] = _postgres_jdbc_url(url, overridden=f"{prefix}.uri" in settings.spark.conf)
        if url.username:
            conf[f"{prefix}.jdbc.user"] = url.username
        if url.password:
            conf[f"{prefix}.jdbc.password"] = str(url.password)
    else:
        raise ConfigError(f"lakehouse.catalog_uri: backend {backend!r} is not supported (use sqlite or postgresql)")
    return conf


# libpq connection parameters (as in a psycopg2 URI's query) and their PostgreSQL JDBC driver names.
_JDBC_PARAMETERS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "options": "options",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
}


def _postgres_jdbc_url(url: URL, overridden: bool) -> str:
    """The JDBC URL of the catalog database pyiceberg reaches through ``url``, connection parameters included (TLS,
    search_path): Spark must reach the same catalog the same way. A parameter without a JDBC equivalent fails,
    naming it, unless spark.conf sets the catalog's uri itself (``overridden``)."""
    host = url.host or "localhost"
    if ":" in host:
        host = f"[{host}]"  # IPv6
    port = f":{url.port}" if url.port else ""
    parameters: list[tuple[str, str]] = []
    for name, value in url.query.items():
        values = [value] if isinstance(value, str) else list(value)
        jdbc_name = _JDBC_PARAMETERS.get(name)
        if jdbc_name is None or len(values) != 1:
            if overridden:
                continue
            raise ConfigError(
                f"lakehouse.catalog_uri: the connection parameter {name!r} has no PostgreSQL JDBC equivalent cdclake "
                f"knows (it translates {', '.join(sorted(_JDBC_PARAMETERS))}); Spark would reach the catalog "
                "without it. Set Spark's own URL under spark.conf: spark.sql.catalog.<catalog_name>.uri"
            )
        parameters.append((jdbc_name, values[0]))
    query = f"?{urlencode(parameters)}" if parameters else ""
    return f"jdbc:postgresql://{host}{port}/{url.database}{query}"


def read_spark_defaults(path: Path) -> dict[str, str]:
    conf: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        conf[key] = value.strip()
    return conf


def spark_master(settings: Settings) -> str:
    """The master Spark runs on: spark.master in spark.conf, else spark.master's own setting."""
    return settings.spark.conf.get("spark.master", settings.spark.master)


def is_local_master(master: str) -> bool:
    return master.strip().startswith("local")


def local_warehouse_on_cluster(settings: Settings) -> str | None:
    """Why a warehouse on a local path is suspect with this master, or None. Not an error: a cluster on one host, or
    a path every node mounts at the same place, works."""
    master = spark_master(settings)
    warehouse = warehouse_uri(settings)
    if is_local_master(master) or not warehouse.startswith("file:"):
        return None
    return (
        f"lakehouse.warehouse is a local path ({warehouse}) and spark.master is {master}: each executor writes "
        "its data files to that path on its own host, where the driver and the other executors cannot read them, "
        "unless every node mounts the same storage there. Use storage every node reaches (s3a://, hdfs://)"
    )


def spark_conf(settings: Settings) -> dict[str, str]:
    """Every Spark setting of this lakehouse: static defaults (with those of a local master: spark_conf/local.conf),
    derived catalog, jars, then user overrides."""
    conf = read_spark_defaults(EMBEDDED_SPARK_CONF)
    if is_local_master(spark_master(settings)):
        conf.update(read_spark_defaults(PROJECT_ROOT / "spark_conf" / "local.conf"))
    conf.update(jdbc_catalog_conf(settings))
    conf["spark.sql.defaultCatalog"] = settings.lakehouse.catalog_name
    conf["spark.sql.warehouse.dir"] = str(runtime_dir() / "spark-warehouse")
    conf["spark.jars"] = ",".join(spark_jars())
    conf["spark.master"] = settings.spark.master
    conf["spark.driver.memory"] = settings.spark.driver_memory
    jars = conf["spark.jars"]
    conf.update(settings.spark.conf)
    if "spark.jars" in settings.spark.conf:
        # The user's jars (hadoop-aws for s3a://) come in addition to cdclake's: the Iceberg runtime must stay.
        listed = [jar.strip() for jar in f"{jars},{settings.spark.conf['spark.jars']}".split(",")]
        conf["spark.jars"] = ",".join(dict.fromkeys(jar for jar in listed if jar))
    # The driver's log settings (spark_conf/log4j2.properties), unless the user names a log4j2 file of their own.
    options = conf.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in options:
        log_config = (PROJECT_ROOT / "spark_conf" / "log4j2.properties").as_uri()
        conf["spark.driver.extraJavaOptions"] = f"{options} -Dlog4j2.configurationFile={log_config}".strip()
    return conf


def secret_spark_keys(conf: dict[str, str]) -> set[str]:
    """The settings that hold a secret: the catalog's JDBC password, any whose name says so (e.g.
    ``spark.hadoop.fs.s3a.secret.key``) and any whose value is a URI with a password in it (the catalog's JDBC URL
    with ``sslpassword=``): files cdclake writes reference them (``secret_env_name``), never hold them."""
    return {
        key
        for key, value in conf.items()
        if key.endswith(".password") or SECRET_KEY_PATTERN.search(key) or uri_secrets(value)
    }
