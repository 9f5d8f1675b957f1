#!/usr/bin/env bash
# A private PostgreSQL cluster for the tests and benchmarks: unix socket only, in a temporary directory.
#
#   scripts/postgres.sh start [--fast]   prints shell lines to eval: QITOS_TEST_PG_DSN and QITOS_TEST_PG_DIR
#                                        ($QITOS_PG_SERVER_OPTIONS: more "-c name=value" server settings)
#   scripts/postgres.sh stop DIR         stops the cluster started in DIR and deletes DIR
#
# Debian's `postgresql` package is installed with apt when no server binaries are found (root only).
# initdb refuses to run as root, so as root the cluster runs as the `postgres` user (created by the
# package). `--fast` turns fsync off (tests: nothing here must survive a power loss); without it the
# cluster is as durable as a default installation (benchmarks).
set -euo pipefail

find_bindir() {
    local dir
    for dir in /usr/lib/postgresql/*/bin; do
        [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && { echo "$dir"; return 0; }
    done
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
    return 1
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

start() {
    local fast=0
    [ "${1:-}" = "--fast" ] && fast=1
    local bindir
    if ! bindir=$(find_bindir); then
        if [ "$(id -u)" != 0 ]; then
            echo "postgres.sh: no PostgreSQL server binaries and this user cannot install them" >&2
            return 1
        fi
        echo "postgres.sh: installing Debian's postgresql with apt" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        bindir=$(find_bindir) || { echo "postgres.sh: apt installed postgresql but no initdb was found" >&2; return 1; }
    fi
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
        echo "postgres.sh: running as root but there is no 'postgres' user to run the server as" >&2
        return 1
    fi
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/qitos-pg.XXXXXX")
    chmod 755 "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    local options="-c listen_addresses= -c unix_socket_directories=$dir -c max_connections=200"
    options="$options -c shared_buffers=32MB -c max_wal_size=256MB"
    options="$options ${QITOS_PG_SERVER_OPTIONS:-}"
    if [ "$fast" = 1 ]; then
        options="$options -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    fi
    if ! as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1; then
        echo "postgres.sh: initdb failed:" >&2
        cat "$dir/initdb.log" >&2
        rm -rf "$dir"
        return 1
    fi
    if ! as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "$options" -w -t 30 start >/dev/null; then
        echo "postgres.sh: the server did not start:" >&2
        cat "$dir/server.log" >&2
        rm -rf "$dir"
        return 1
    fi
    echo "export QITOS_TEST_PG_DIR='$dir'"
    echo "export QITOS_TEST_PG_DSN='postgresql://postgres@/postgres?host=$dir'"
}

stop() {
    local dir=${1:?usage: postgres.sh stop DIR}
    local bindir
    bindir=$(find_bindir) || return 0
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    *) echo "usage: $0 start [--fast] | stop DIR" >&2; exit 2 ;;
esac
