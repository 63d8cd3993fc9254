# cdclake ingest service: Debezium topics in Kafka -> Iceberg bronze, with pyiceberg and confluent-kafka.
# No JVM, Spark or dbt in this image: silver is built by a separate job (see the dbt service in docker-compose.yml).
#
#   docker build -t cdclake-ingest .
#   docker run --init --stop-timeout 60 -v ./cdclake.yml:/etc/cdclake/cdclake.yml:ro -v warehouse:/warehouse \
#     -p 9108:9108 cdclake-ingest
#
# Your cdclake.yml must write under /warehouse (or use a server catalog and object storage): the rest of the image
# is read-only to the service's user (docs/operations.md).
#
# The base image comes from Docker Hub; behind a registry mirror: --build-arg BASE_IMAGE=<mirror>/python:3.11-slim
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Runtime dependencies of `cdclake ingest` only (all binary wheels: no compiler needed), in their own layer, at the
# versions the test suite passed with (constraints.txt).
COPY requirements-ingest.txt constraints.txt /tmp/
RUN pip install -c /tmp/constraints.txt -r /tmp/requirements-ingest.txt \
    && rm /tmp/requirements-ingest.txt /tmp/constraints.txt

# The package itself; --no-deps keeps pyspark and dbt (pyproject's full dependency list) out of the image.
COPY pyproject.toml README.md /tmp/src/
COPY ingest /tmp/src/ingest
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src

# Non-root user; /warehouse is where a local warehouse volume is mounted (writable by that user).
# The default config uses absolute paths only, so the service also runs from environment variables alone;
# mount your own file over it (or set CDCLAKE_CONFIG) for a real deployment.
RUN groupadd --gid 10001 cdclake \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /app --shell /usr/sbin/nologin cdclake \
    && mkdir -p /app /etc/cdclake /warehouse \
    && chown cdclake:cdclake /app /warehouse \
    && printf '%s\n' \
        '# Placeholder: mount your cdclake.yml here. Any key can be overridden as CDCLAKE__<SECTION>__<KEY>.' \
        'lakehouse:' \
        '  warehouse: /warehouse' \
        '  catalog_uri: sqlite:////warehouse/catalog.db' \
        > /etc/cdclake/cdclake.yml

WORKDIR /app
USER 10001:10001

# Configuration: the file below, then CDCLAKE__SECTION__KEY variables (which win over the file), and ${VAR}
# references inside the file for secrets. The metrics port is set here, where HEALTHCHECK reads it (this variable
# wins over ingest.metrics_port in the file: change it here, or with -e, and publish that port; EXPOSE only
# documents 9108).
ENV CDCLAKE_CONFIG=/etc/cdclake/cdclake.yml \
    CDCLAKE__INGEST__METRICS_PORT=9108

# /metrics (Prometheus) and /healthz.
EXPOSE 9108

# slim has no curl: ask /healthz with the standard library (an HTTP error or refused connection exits 1), on the
# port the variable above sets.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ['CDCLAKE__INGEST__METRICS_PORT']}/healthz\", timeout=4)"]

# SIGTERM commits the batch in hand, then the service exits 0; give it a stop timeout longer than one flush.
STOPSIGNAL SIGTERM
ENTRYPOINT ["cdclake", "--log-format", "json"]
CMD ["ingest"]
