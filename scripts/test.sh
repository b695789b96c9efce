#!/usr/bin/env bash
# The whole test suite: unit tests, then the integration tests against a real
# nats-server (started by the tests on free ports) and SQLite, then the integration
# tests again against Postgres when a server answers on 127.0.0.1:5432 (or wherever
# ROLLOUT_TEST_DATABASE_URL points). Installs nats-server first if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"

echo "== unit and integration tests (SQLite)" >&2
env -u ROLLOUT_TEST_DATABASE_URL cargo test --all-targets

pg_url="${ROLLOUT_TEST_DATABASE_URL:-}"
if [ -z "$pg_url" ] && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  pg_url="postgres://postgres@127.0.0.1:5432/test"
fi
if [ -n "$pg_url" ]; then
  echo "== integration tests (Postgres)" >&2
  ROLLOUT_TEST_DATABASE_URL="$pg_url" cargo test --test pipeline
else
  echo "== no Postgres answers on 127.0.0.1:5432 and ROLLOUT_TEST_DATABASE_URL is unset: Postgres run skipped" >&2
fi
