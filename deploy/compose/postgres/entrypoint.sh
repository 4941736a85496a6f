#!/bin/sh
# First start: initdb with POSTGRES_PASSWORD for user postgres (scram-sha-256 over the network), database smg.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" >"$pwfile"
  initdb -D "$PGDATA" -U postgres --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >/dev/null
  createdb -h /tmp -U postgres smg
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp
