#!/usr/bin/env bash
# Creates one virtual environment per worker toolchain pinned in infra/workers/<kind>-<version>/,
# each with ctxfarm (cluster extras) and that toolchain's onnxruntime pair:
#   .venvs/qnn-2.47.0  .venvs/qnn-2.49.40  .venvs/qnn-2.51.0   (and trt-* where a GPU build is asked for)
# Usage: infra/workers/create-venvs.sh [KIND-VERSION ...]   (default: every qnn-* directory)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
kinds=("$@")
if [ ${#kinds[@]} -eq 0 ]; then
  for d in infra/workers/qnn-*/; do kinds+=("$(basename "$d")"); done
fi
mkdir -p .venvs
for kind in "${kinds[@]}"; do
  req="infra/workers/$kind/requirements.txt"
  [ -f "$req" ] || { echo "no $req" >&2; exit 1; }
  venv=".venvs/$kind"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import workers.runner" 2>/dev/null \
     && cmp -s "$req" "$venv/.requirements" ; then
    # ctxfarm's own dependencies may have changed since (pyproject.toml): re-install it only.
    if ! cmp -s pyproject.toml "$venv/.pyproject"; then
      "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" -e "$ROOT[cluster]" \
        > "$venv.pip.log" 2>&1 || { cat "$venv.pip.log"; exit 1; }
      cp pyproject.toml "$venv/.pyproject"
    fi
    echo "$venv up to date"; continue
  fi
  echo "creating $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" -e "$ROOT[cluster]" \
    > "$venv.pip.log" 2>&1 || { cat "$venv.pip.log"; exit 1; }
  cp "$req" "$venv/.requirements"
  cp pyproject.toml "$venv/.pyproject"
  "$venv/bin/python" - "${kind%%-*}" <<'PY' || echo "   (toolchain not usable on this machine: see above)"
import sys
from workers.backends import get_runner
print("  ", get_runner(sys.argv[1]).toolchain())
PY
done
