#!/usr/bin/env bash
# Checks what replicator needs from the operating system: Java 17+, the PostgreSQL server
# binaries (tests and `demo` start throwaway clusters) and the PostgreSQL JDBC driver that Spark
# loads; and what the tests check with the real clients: promtool (Debian's `prometheus`)
# tests deploy/prometheus's alert rules, and headless Chromium renders the report page. As root on Debian/Ubuntu, missing pieces are installed with apt-get; otherwise the exact
# command is printed and the script fails.
set -euo pipefail

missing=()

java_major() {
    command -v java >/dev/null 2>&1 || { echo 0; return; }
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
[ "$(java_major)" -ge 17 ] 2>/dev/null || missing+=(openjdk-17-jre-headless)

pg_bin_found() {
    [ -n "${REPLICATOR_PG_BIN:-}" ] && [ -x "$REPLICATOR_PG_BIN/initdb" ] && return 0
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 0
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}
pg_bin_found || missing+=(postgresql)

jdbc_found() {
    [ -n "${REPLICATOR_JDBC_JAR:-}" ] && [ -f "$REPLICATOR_JDBC_JAR" ] && return 0
    [ -f /usr/share/java/postgresql.jar ]
}
jdbc_found || missing+=(libpostgresql-jdbc-java)

command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || missing+=(chromium)

[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    exit 0
fi
echo "system-deps: missing ${missing[*]}. Install them with:" >&2
echo "    sudo sh -c '$cmd'" >&2
exit 1
