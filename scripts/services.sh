#!/usr/bin/env bash
# Make sure the real Postgres (127.0.0.1:5432, database `test`) and Redis (127.0.0.1:6379) the tests use are
# running; start them if they are down. Fails loudly if one cannot be started.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

if command -v pg_isready >/dev/null && ! pg_up; then
  echo "starting postgres"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 1 50); do pg_up && break; sleep 0.2; done
  pg_up || { echo "error: postgres is not running on 127.0.0.1:5432 and could not be started" >&2; exit 1; }
fi
if command -v redis-server >/dev/null && ! redis_up; then
  echo "starting redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
  for _ in $(seq 1 50); do redis_up && break; sleep 0.2; done
  redis_up || { echo "error: redis is not running on 127.0.0.1:6379 and could not be started" >&2; exit 1; }
fi
if command -v psql >/dev/null && pg_up; then
  # The `test` database the tests use; create it if this machine lacks it.
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='test'" 2>/dev/null \
    | grep -q 1 || psql -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE test" >/dev/null 2>&1 || true
fi
