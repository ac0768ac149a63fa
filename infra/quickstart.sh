#!/usr/bin/env bash
# Quick start on the embedded default (no servers): SQLite index + local blob dir in FARM_HOME
# (default ~/.local/share/ctxfarm), compiles in a child process of the CLI.
# Builds light_resnet50 (shipped in the onnx wheel) for two Snapdragon SoCs, fetches it as a
# device would, loads the fetched context model with onnxruntime-qnn, and compares the times.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then "$PYTHON" -m venv .venv; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[qnn,service]' > .venv/pip.log 2>&1 \
  || { cat .venv/pip.log; exit 1; }
FARM=.venv/bin/farm
# Byte-compiled once here: Python writes .pyc files itself on a first import, except under
# PYTHONDONTWRITEBYTECODE (set on some CI hosts), where every `farm` call compiled the CLI from source.
.venv/bin/python -m compileall -q -j 0 farm registry workers infra > /dev/null || exit 1
MODEL=$(.venv/bin/python -c 'import onnx, pathlib; print(pathlib.Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx")')
OUT=$(mktemp -d "${TMPDIR:-/tmp}/ctxfarm-device-XXXXXX")
trap 'rm -rf "$OUT"' EXIT

echo "== farm build (compiles what is missing; run it again and it says cached)"
$FARM build "$MODEL" --target qnn:SM8650 --target qnn:SM8750 --name resnet50 --tag stable
echo "== the same build again: answered from the index"
$FARM build "$MODEL" --target qnn:SM8650 --target qnn:SM8750 --name resnet50 --tag stable
$FARM ls --model resnet50:stable --target qnn:SM8650 --json > "$OUT/ls.json"

echo "== farm resolve / fetch, as a Snapdragon 8 Gen 3 device with the QNN 2.51.0 runtime"
$FARM resolve --model resnet50:stable --soc snapdragon-8-gen-3 --qnn 2.51.0
$FARM fetch --model resnet50:stable --soc SM8650 --qnn 2.51.0 --dest "$OUT/device" --load-check --json > "$OUT/fetch.json"
ls -l "$OUT/device"

.venv/bin/python - "$OUT/ls.json" "$OUT/fetch.json" <<'PY'
import json, sys
listed, fetch = (json.load(open(p)) for p in sys.argv[1:3])
compile_s, load_s = listed[0]["compile_seconds"], fetch["load"]["load_seconds"]
print(f"== light_resnet50 on qnn:SM8650: compile {compile_s:.2f} s vs load of the fetched context "
      f"{load_s * 1000:.1f} ms ({compile_s / load_s:.0f}x faster)")
PY
echo "== farm is $PWD/.venv/bin/farm: 'source .venv/bin/activate' (or export PATH=\"$PWD/.venv/bin:\$PATH\") puts it on PATH"
