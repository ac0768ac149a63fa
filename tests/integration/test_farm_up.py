"""The local farm (python -m infra.devfarm, what infra/farm-up.sh runs) end to end: it comes up
with the HTTP service, a release of 2 SDKs x 2 SoCs is submitted over HTTP and installed by a
device, a killed worker is restarted, and SIGTERM stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.common.onnx_models import light
from tests.common.procs import alive, descendants, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_farm_up_end_to_end(tmp_path: Path) -> None:
    base = tmp_path / "farm"
    log = tmp_path / "devfarm.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.setdefault("AWS_ACCESS_KEY_ID", "ctxfarm")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "ctxfarm-secret")
    farm = subprocess.Popen([sys.executable, "-m", "infra.devfarm", "--dir", str(base), "--api-port", "0",
                             "--ephemeral"], env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        assert wait_for(lambda: (base / "farm.json").exists() or farm.poll() is not None, 300, poll=0.1)
        assert farm.poll() is None, log.read_text()[-3000:]
        info = json.loads((base / "farm.json").read_text())
        farm_env = {**env, **info["env"]}
        server = info["env"]["FARM_SERVER"]

        def cli(e: dict[str, str], *args: str) -> str:
            p = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=e, capture_output=True, text=True,
                               timeout=400, stdin=subprocess.DEVNULL)
            assert p.returncode == 0, f"{args}\n{p.stdout}\n{p.stderr}"
            return p.stdout

        # The printed exports are enough for the client: FARM_SERVER and its token.
        exports = dict(line.strip().removeprefix("export ").split("=", 1) for line in log.read_text().splitlines()
                       if line.strip().startswith("export "))
        assert exports["FARM_TOKEN"].strip("'") == info["env"]["FARM_TOKEN"]
        pipeline = {**env, "FARM_HOME": str(tmp_path / "pipeline"), "FARM_SERVER": server,
                    "FARM_TOKEN": info["env"]["FARM_TOKEN"]}
        assert len(json.loads(cli(pipeline, "workers", "--json"))) == 3
        json.loads(cli(pipeline, "coverage", "--json"))
        submit = cli(farm_env, "token", "create", "ci", "--scope", "submit").strip().splitlines()[-1]
        read = cli(farm_env, "token", "create", "device", "--scope", "read").strip().splitlines()[-1]
        bare = {k: v for k, v in env.items() if not k.startswith("AWS_")}
        bare["FARM_HOME"] = str(tmp_path / "bare")
        st = json.loads(cli(bare, "submit", str(light("squeezenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                            "--sdk", "2.47.0", "--sdk", "2.51.0", "--name", "sq", "--wait", "--timeout", "360",
                            "--server", server, "--token", submit, "--json"))
        assert st["ok"] and len(st["builds"]) == 4
        got = json.loads(cli(bare, "install", "--server", server, "--token", read, "--model", "sq", "--soc", "SM8750",
                             "--qnn", "2.49.40", "--dest", str(tmp_path / "device"), "--json"))
        assert Path(got["ctx_model"]).exists()  # a 2.49.40 runtime gets the 2.47.0 build
        # A dead worker is reported and restarted.
        victim = info["worker_pids"][0]
        os.killpg(victim, signal.SIGKILL)
        assert wait_for(lambda: "restarting" in log.read_text(), 30), log.read_text()[-2000:]
        started = set(descendants(farm.pid))
        assert len(started) >= 6  # redis, seaweedfs, 3 workers (+ their pools), the API
    finally:
        farm.send_signal(signal.SIGTERM)
        try:
            farm.wait(timeout=120)
        except subprocess.TimeoutExpired:
            farm.kill()
            raise
    assert wait_for(lambda: not [p for p in started if alive(p)], 30), [p for p in started if alive(p)]
