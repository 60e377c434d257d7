#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: loopback only, a free port, a data folder
# of its own under /tmp, one database and one user with a random password.
#
#   eval "$(bash scripts/start_test_postgres.sh)"        # start; exports the two below
#   bash scripts/start_test_postgres.sh stop "$AUTOTUNE_TEST_POSTGRES_DATA"
#
# Prints on stdout (nothing else goes there):
#   export AUTOTUNE_TEST_POSTGRES=postgresql://autotune:PASSWORD@127.0.0.1:PORT/autotune
#   export AUTOTUNE_TEST_POSTGRES_DATA=/tmp/autotune-pg.XXXXXX
# Installs the Debian `postgresql` package first when no server is installed (needs root).
# Exits non-zero, saying why on stderr, when the server cannot be started.
set -euo pipefail

as_owner() {  # the server refuses to run as root: run it as the postgres user then
  if [ "$(id -u)" = 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

bin_dir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then
    echo "$dir"
  elif command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v initdb)"
  fi
}

if [ "${1:-}" = stop ]; then
  data=${2:?usage: start_test_postgres.sh stop DATA_DIR}
  bin=$(bin_dir)
  [ -n "$bin" ] && [ -f "$data/postmaster.pid" ] && \
    as_owner "$bin/pg_ctl" -D "$data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$data"
  exit 0
fi

if [ -z "$(bin_dir)" ]; then
  echo "start_test_postgres: installing the Debian postgresql package" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "start_test_postgres: no PostgreSQL server here, and installing one needs root" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
bin=$(bin_dir)
[ -n "$bin" ] || { echo "start_test_postgres: no initdb after installing postgresql" >&2; exit 1; }

python=$(command -v python3 || command -v python)
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
password=$("$python" -c 'import secrets; print(secrets.token_hex(16))')
data=$(mktemp -d /tmp/autotune-pg.XXXXXX)
chmod 700 "$data"
[ "$(id -u)" = 0 ] && chown postgres: "$data"

if ! as_owner "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --no-instructions >"$data.initdb.log" 2>&1; then
  echo "start_test_postgres: initdb failed:" >&2
  cat "$data.initdb.log" >&2
  exit 1
fi
rm -f "$data.initdb.log"
# loopback only; its socket in its own folder; durability traded for speed (throwaway data)
options="-c listen_addresses=127.0.0.1 -p $port -k $data -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
if ! as_owner "$bin/pg_ctl" -D "$data" -o "$options" -l "$data/server.log" -w -t 60 start >/dev/null; then
  echo "start_test_postgres: the server did not start:" >&2
  cat "$data/server.log" >&2 || true
  exit 1
fi
as_owner "$bin/psql" -h "$data" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q >/dev/null <<SQL
CREATE ROLE autotune LOGIN PASSWORD '$password';
CREATE DATABASE autotune OWNER autotune;
SQL
echo "export AUTOTUNE_TEST_POSTGRES=postgresql://autotune:$password@127.0.0.1:$port/autotune"
echo "export AUTOTUNE_TEST_POSTGRES_DATA=$data"
