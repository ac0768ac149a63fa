#!/usr/bin/env bash
# A local farm in one command: Redis, PostgreSQL and SeaweedFS (the machine's Redis/PostgreSQL
# when they run, else private ones), one worker per QNN SDK venv (2.47.0, 2.49.40, 2.51.0) and the
# HTTP service. Prints the FARM_* settings to export in another shell; a dead worker is reported
# and restarted; Ctrl-C or SIGTERM stops everything it started.
#   infra/farm-up.sh [--dir DIR] [--api-port PORT] [--ephemeral]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${FARM_UP_DIR:-$PWD/.farm}
if [ "${1:-}" = "--dir" ]; then DIR=$2; shift 2; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[qnn,cluster,test,sign,service]' > .venv/pip.log 2>&1 \
  || { cat .venv/pip.log; exit 1; }
./infra/workers/create-venvs.sh
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m infra.devfarm --dir "$DIR" "$@"
