#!/usr/bin/env bash
# Run a command beside a throwaway PostgreSQL cluster:
#
#   scripts/with-postgres.sh CMD [ARGS...]
#
# starts a private cluster on 127.0.0.1 (a free port from 54329 up), runs CMD with
#   MUTRANSFER_TEST_POSTGRES=postgresql://mutransfer:<random password>@127.0.0.1:<port>/mutransfer
# exported, then stops the cluster and deletes its directory (also when CMD fails or on Ctrl-C)
# and exits with CMD's exit code. The PostgreSQL tests skip themselves without that variable.
#
# - Server binaries: /usr/lib/postgresql/<newest>/bin (Debian), else initdb on PATH; the
#   environment variable PG_BINDIR overrides both. If none is found and we are root with
#   apt-get, Debian's `postgresql` package is installed first; if that is impossible, a warning
#   is printed and CMD runs without the variable.
# - postgres refuses to run as root: as root, the cluster runs as the `postgres` user (created
#   if missing) in a temp directory it owns. TCP connections need the password (scram);
#   the Unix socket lives in that private directory only.
# - If MUTRANSFER_TEST_POSTGRES is already set, no cluster is started: CMD uses that server.
set -uo pipefail

ME="with-postgres"
VAR=MUTRANSFER_TEST_POSTGRES
FIRST_PORT=54329
PORT_TRIES=40

if [ $# -eq 0 ]; then
    echo "usage: $0 CMD [ARGS...]" >&2
    exit 2
fi

warn() { echo "$ME: warning: $*" >&2; }

run_without() {  # run_without REASON CMD...: CMD without a database
    warn "$1"
    warn "running without PostgreSQL: $VAR is unset and the PostgreSQL tests will be skipped"
    shift
    unset "$VAR"
    exec "$@"
}

if [ -n "${!VAR:-}" ]; then
    echo "$ME: $VAR is already set; using that server, starting none" >&2
    exec "$@"
fi

is_root() { [ "$(id -u)" -eq 0 ]; }

find_bindir() {
    if [ -n "${PG_BINDIR:-}" ]; then
        [ -x "$PG_BINDIR/initdb" ] && [ -x "$PG_BINDIR/pg_ctl" ] && echo "$PG_BINDIR"
        return
    fi
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
        echo "$dir"
        return
    fi
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
    fi
}

BINDIR=$(find_bindir)
WHY="not installable here (that needs root and apt-get)"
if [ -z "$BINDIR" ] && [ -z "${PG_BINDIR:-}" ]; then
    if is_root && command -v apt-get >/dev/null 2>&1; then
        echo "$ME: PostgreSQL server not found; installing Debian's postgresql package" >&2
        aptlog=$(mktemp)
        apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >>"$aptlog" 2>&1; }
        if ! apt_install; then
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$aptlog" 2>&1 && apt_install
        fi
        BINDIR=$(find_bindir)
        if [ -z "$BINDIR" ]; then
            tail -n 15 "$aptlog" | sed "s/^/$ME: apt-get: /" >&2
            WHY="installing Debian's postgresql package failed"
        fi
        rm -f "$aptlog"
    fi
fi
if [ -z "$BINDIR" ]; then
    if [ -n "${PG_BINDIR:-}" ]; then
        run_without "PostgreSQL server binaries (initdb, pg_ctl) not found in PG_BINDIR=$PG_BINDIR" "$@"
    fi
    run_without "PostgreSQL server binaries (initdb, pg_ctl) not found, and $WHY" "$@"
fi

# ---------------------------------------------------------------------------- the cluster's user

PGUSER_OS=$(id -un)
if is_root; then
    PGUSER_OS=postgres
    if ! id postgres >/dev/null 2>&1; then
        useradd --system --user-group --home-dir /nonexistent --no-create-home \
            --shell /usr/sbin/nologin postgres >/dev/null 2>&1 \
            || run_without "cannot create the 'postgres' user to run the server as (postgres refuses root)" "$@"
    fi
fi

TMP=""
cleanup() {
    if [ -n "$TMP" ] && [ -d "$TMP" ]; then
        if [ -f "$TMP/data/postmaster.pid" ]; then
            as_pg "$BINDIR/pg_ctl" -D "$TMP/data" -m immediate -w -t 30 stop >/dev/null 2>&1
        fi
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

as_pg() {  # as_pg CMD...: run as the cluster's user, from a directory it can enter
    if is_root; then
        (cd "$TMP" && runuser -u postgres -- "$@")
    else
        (cd "$TMP" && "$@")
    fi
}

for base in "${TMPDIR:-/tmp}" /tmp; do
    TMP=$(mktemp -d "$base/mutransfer-pg.XXXXXX" 2>/dev/null) || { TMP=""; continue; }
    is_root && chown postgres: "$TMP"
    if as_pg test -w "$TMP" 2>/dev/null; then
        break
    fi
    rm -rf "$TMP"
    TMP=""
done
[ -n "$TMP" ] || run_without "no temp directory the '$PGUSER_OS' user can write" "$@"
chmod 700 "$TMP"

PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
printf '%s\n' "$PASSWORD" >"$TMP/pwfile"  # for initdb's superuser; TCP logins need a password
chmod 600 "$TMP/pwfile"
is_root && chown postgres: "$TMP/pwfile"

if ! as_pg "$BINDIR/initdb" -D "$TMP/data" -U postgres --pwfile="$TMP/pwfile" -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 >"$TMP/initdb.log" 2>&1; then
    sed "s/^/$ME: initdb: /" "$TMP/initdb.log" >&2
    echo "$ME: error: initdb failed" >&2
    exit 1
fi
rm -f "$TMP/pwfile"

cat >>"$TMP/data/postgresql.conf" <<EOF

# with-postgres.sh: a private, throwaway cluster
listen_addresses = '127.0.0.1'
unix_socket_directories = '$TMP'
unix_socket_permissions = 0700
password_encryption = 'scram-sha-256'
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 32MB
max_connections = 200
EOF

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

PORT=""
port=$FIRST_PORT
for _ in $(seq "$PORT_TRIES"); do
    if ! port_in_use "$port"; then
        : >"$TMP/server.log"
        is_root && chown postgres: "$TMP/server.log"
        if as_pg "$BINDIR/pg_ctl" -D "$TMP/data" -l "$TMP/server.log" -o "-p $port" -w -t 60 start \
                >"$TMP/pg_ctl.log" 2>&1; then
            PORT=$port
            break
        fi
        if ! grep -qiE "could not (bind|create listen)|address already in use" "$TMP/server.log"; then
            sed "s/^/$ME: server: /" "$TMP/pg_ctl.log" "$TMP/server.log" >&2
            echo "$ME: error: the PostgreSQL server did not start" >&2
            exit 1
        fi
    fi
    port=$((port + 1))
done
if [ -z "$PORT" ]; then
    echo "$ME: error: no free port in $FIRST_PORT..$((FIRST_PORT + PORT_TRIES - 1))" >&2
    exit 1
fi

# Role and database over the private socket (trust), then check the password over TCP.
if ! as_pg "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$TMP" -p "$PORT" -U postgres -d postgres \
        >"$TMP/psql.log" 2>&1 <<EOF
CREATE ROLE mutransfer LOGIN PASSWORD '$PASSWORD';
CREATE DATABASE mutransfer OWNER mutransfer;
EOF
then
    sed "s/^/$ME: psql: /" "$TMP/psql.log" >&2
    echo "$ME: error: could not create the mutransfer role and database" >&2
    exit 1
fi
if ! PGPASSWORD=$PASSWORD as_pg "$BINDIR/psql" -X -q -w -h 127.0.0.1 -p "$PORT" -U mutransfer -d mutransfer \
        -c "SELECT 1" >"$TMP/psql.log" 2>&1; then
    sed "s/^/$ME: psql: /" "$TMP/psql.log" >&2
    echo "$ME: error: cannot log in over TCP with the password" >&2
    exit 1
fi

export "$VAR=postgresql://mutransfer:$PASSWORD@127.0.0.1:$PORT/mutransfer"
echo "$ME: PostgreSQL $("$BINDIR/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT" \
     "(throwaway cluster in $TMP; $VAR is set)" >&2
"$@"
exit $?
