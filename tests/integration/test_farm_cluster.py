"""The distributed farm for real: Celery workers in their own QNN SDK venvs (.venvs/qnn-*,
made by infra/workers/create-venvs.sh) against a private Redis, PostgreSQL and SeaweedFS."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from infra.devfarm.services import Service, start_redis
from tests.common.onnx_models import conv_relu_add, light, partly_unsupported
from tests.common.procs import alive, compile_children, wait_for
from tests.common.schemas import valid

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".venvs"


def venv_farm(version: str) -> Path:
    exe = VENVS / f"qnn-{version}" / "bin" / "farm"
    if not exe.exists():
        pytest.fail(f"{exe} missing: run infra/workers/create-venvs.sh (infra/test.sh does)")
    return exe


class Farm:
    """A private farm: its own Redis, its own PostgreSQL database, an S3 prefix; workers as
    subprocesses, each in its own process group so a test can SIGKILL one whole."""

    def __init__(self, tmp: Path, redis: Service, pg_url: str, s3_url: str):
        self.tmp, self.redis, self.workers = tmp, redis, []  # type: ignore[var-annotated]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        self.env.update({
            "FARM_HOME": str(tmp / "home"), "FARM_DATABASE_URL": pg_url, "FARM_STORE_URL": s3_url,
            "FARM_BROKER_URL": redis.url, "FARM_HEARTBEAT_SECONDS": "1", "FARM_LEASE_SECONDS": "6",
            "FARM_VISIBILITY_TIMEOUT": "8", "FARM_MAX_ATTEMPTS": "3",
            "FARM_COMPILE_TIMEOUT": "120",
            # A retried build waits 0.5 s, then 1 s (the default's 5 and 10 s were most of the
            # poison model's test): the waits' order and cap are the same.
            "FARM_RETRY_BACKOFF_SECONDS": "0.5",
        })

    def cli(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"farm {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    @contextmanager
    def over_http(self, tmp: Path, fleet: str = "fleet") -> Iterator[Any]:
        """``farm serve`` on this farm, a submit and a read token, and ``cli``: the CLI of a
        machine with only a URL and a token (no database, broker or store settings, no
        credentials; its own empty FARM_HOME), asserting each call succeeds."""
        from types import SimpleNamespace

        from infra.devfarm.services import free_port
        from tests.common.service import serve

        submit = self.cli("token", "create", "pipeline", "--scope", "submit").stdout.strip().splitlines()[-1]
        read = self.cli("token", "create", fleet, "--scope", "read").stdout.strip().splitlines()[-1]
        port = free_port()
        server = serve(self.env, port, tmp / "serve.log")
        bare = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "AWS_"))}
        bare["FARM_HOME"] = str(tmp / "client-home")

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=bare, capture_output=True,
                                  text=True, timeout=300, stdin=subprocess.DEVNULL)
            assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
            return proc

        try:
            yield SimpleNamespace(url=f"http://127.0.0.1:{port}", submit=submit, read=read, cli=cli, env=bare)
        finally:
            server.terminate()
            server.wait(timeout=30)

    def start_worker(self, version: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        path = self.tmp / f"worker-{version}-{len(self.workers)}.log"
        log = open(path, "wb")
        proc = subprocess.Popen([str(venv_farm(version)), "worker"], env={**self.env, **(extra_env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.workers.append(proc)
        deadline = time.monotonic() + 60
        registered = False
        while time.monotonic() < deadline:
            registered = registered or any(w["pid"] == proc.pid for w in self.live_workers())
            # The Celery consumer starts right after registration: Celery logs "<name> ready." once
            # it consumes (was a fixed second's sleep, which a loaded box could outrun).
            if registered and " ready." in path.read_text(errors="replace"):
                return proc
            assert proc.poll() is None, path.read_text()
            time.sleep(0.1)
        raise AssertionError(f"worker {version} did not {'start consuming' if registered else 'register'}: "
                             f"{path.read_text()[-3000:]}")

    def live_workers(self) -> list[dict[str, Any]]:
        """What `farm workers --json` prints (the same view, registry.views.worker_rows), read in
        this process: polled while a worker starts, where a CLI call per poll cost 0.5 s of a
        2-core box's CPU the starting worker needs. Tests that check the command call it."""
        from farm.core.settings import Settings
        from registry.views import worker_rows

        reg = self.db()
        try:
            with reg.db.session() as s:
                return worker_rows(s, stale_after=Settings.from_env(self.env).worker_stale_after)
        finally:
            reg.close()

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        # Every worker is told first, then waited for: their warm shutdowns overlap.
        running = [p for p in self.workers if p.poll() is None]
        for p in running:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in running:
            p.wait(timeout=30)

    def db(self) -> Any:
        from farm.core.settings import Settings
        from registry.index import Registry

        return Registry.open(Settings.from_env(self.env))

    def builds(self) -> list[dict[str, Any]]:
        from sqlalchemy import select

        from registry.models import Build

        reg = self.db()
        try:
            with reg.db.session() as s:
                return [{"id": b.id, "state": b.state, "attempts": b.attempts, "code": b.error_code,
                         "toolchain": b.toolchain, "target": b.target}
                        for b in s.scalars(select(Build).order_by(Build.id))]
        finally:
            reg.close()

    def wait_builds(self, pred: Any, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.builds()
            if rows and pred(rows):
                return rows
            time.sleep(0.2)
        raise AssertionError(f"builds did not reach the state in time: {self.builds()}")


@pytest.fixture
def farm_cluster(tmp_path: Path, pg_url: str, s3_url: str) -> Iterator[Farm]:
    redis = start_redis(tmp_path / "redis", persist=True)
    # pg_url is at the migrations' head already (the operator's `farm db upgrade`, tested in
    # test_pipeline): a `farm db upgrade` here was a second of nothing per test.
    f = Farm(tmp_path, redis, pg_url, s3_url)
    try:
        yield f
    finally:
        f.stop()
        f.redis.stop()


def verdicts(f: Farm) -> dict[tuple[str, str], str]:
    from sqlalchemy import select

    from registry.models import Artifact, CompatVerdict

    reg = f.db()
    try:
        with reg.db.session() as s:
            rows = s.execute(select(Artifact.target, Artifact.toolchain, CompatVerdict.runtime_version,
                                    CompatVerdict.verdict).join(CompatVerdict, CompatVerdict.artifact_id == Artifact.id))
            return {(f"{t}@{tc}", rv): v for t, tc, rv, v in rows}
    finally:
        reg.close()


def test_release_two_sdks_two_socs_with_probes(farm_cluster: Farm) -> None:
    f = farm_cluster
    f.start_worker("2.47.0")
    f.start_worker("2.51.0")
    model = str(light("squeezenet"))
    args = ["submit", model, "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--sdk", "2.47.0", "--sdk", "2.51.0",
            "--name", "sq", "--tag", "stable", "--wait", "--timeout", "180", "--json"]
    out = json.loads(f.cli(*args).stdout)
    assert sorted((b["target"], b["toolchain"], b["state"]) for b in out["builds"]) == [
        ("qnn:SM8650", "2.47.0", "succeeded"), ("qnn:SM8650", "2.51.0", "succeeded"),
        ("qnn:SM8750", "2.47.0", "succeeded"), ("qnn:SM8750", "2.51.0", "succeeded")]
    assert all(b["attempts"] == 1 for b in out["builds"])
    assert len({b["artifact"] for b in out["builds"]}) == 4
    # The probe: each artifact loaded under the other toolchain, evidence recorded.
    deadline = time.monotonic() + 90
    while len(verdicts(f)) < 8 and time.monotonic() < deadline:
        time.sleep(0.2)
    v = verdicts(f)
    assert v[("SM8650@2.51.0", "2.47.0")] == "fails" and v[("SM8750@2.51.0", "2.47.0")] == "fails"
    assert v[("SM8650@2.47.0", "2.51.0")] == "loads" and v[("SM8750@2.47.0", "2.51.0")] == "loads"
    # and each under its own toolchain, by the worker that built it
    assert all(v[(f"{t}@{tc}", tc)] == "loads" for t in ("SM8650", "SM8750") for tc in ("2.47.0", "2.51.0"))
    # Resolve uses it: a 2.47 device gets the 2.47 build (probe evidence), a 2.51 one the 2.51 build.
    r47 = json.loads(f.cli("resolve", "--model", "sq:stable", "--soc", "SM8650", "--qnn", "2.47.0", "--json").stdout)
    r51 = json.loads(f.cli("resolve", "--model", "sq:stable", "--soc", "SM8650", "--qnn", "2.51.0", "--json").stdout)
    assert (r47["toolchain"], r51["toolchain"]) == ("2.47.0", "2.51.0")
    assert r47["source"] == r51["source"] == "probe"
    # No evidence for 2.49.40: the rule decides (newest build <= runtime).
    r49 = json.loads(f.cli("resolve", "--model", "sq:stable", "--soc", "SM8650", "--qnn", "2.49.40", "--json").stdout)
    assert (r49["toolchain"], r49["source"]) == ("2.47.0", "rule")
    # A fully cached re-submission compiles nothing and is final at once.
    again = json.loads(f.cli(*args).stdout)
    assert [b["state"] for b in again["builds"]] == ["succeeded"] * 4
    assert [b["build"] for b in again["builds"]] == [b["build"] for b in out["builds"]]
    assert all(b["attempts"] == 1 for b in f.builds())
    workers = json.loads(f.cli("workers", "--json").stdout)
    assert sorted((w["toolchain"], w["onnxruntime"], w["jobs"]) for w in workers) == [
        ("2.47.0", "1.24.4", 2), ("2.51.0", "1.32.0", 2)]


def test_concurrent_identical_submissions_compile_once(farm_cluster: Farm, tmp_path: Path) -> None:
    f = farm_cluster
    f.start_worker("2.51.0")
    model = conv_relu_add(tmp_path / "m.onnx", seed=3)
    args = [sys.executable, "-m", "farm.cli", "submit", str(model), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--json"]
    procs = [subprocess.Popen(args, env=f.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    ids = {json.loads(o)["builds"][0]["build"] for o, _ in outs}
    assert len(ids) == 1
    rows = f.wait_builds(lambda r: r[0]["state"] == "succeeded")
    assert [(r["state"], r["attempts"]) for r in rows] == [("succeeded", 1)]


def test_worker_events_wake_the_waiter_and_phases_are_recorded(farm_cluster: Farm) -> None:
    from farm.core.settings import Settings
    from farm.pipeline.events import Subscription
    from farm.pipeline.plan import wait_release

    f = farm_cluster
    f.start_worker("2.51.0")
    out = json.loads(f.cli("submit", str(light("shufflenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                           "--sdk", "2.51.0", "--json").stdout)
    settings = Settings.from_env(f.env)
    # The fallback poll is an hour: only the worker's events (Redis pub/sub) can end this wait.
    with Subscription(settings.broker_url) as sub:
        st = wait_release(settings, out["release"], poll=3600, timeout=3600, events=sub)
        assert st.ok and sub.wakeups >= 1
    phases = [json.loads(f.cli("status", "--build", str(b["build"]), "--json").stdout)["phases"]
              for b in st.builds]
    # One worker, one model: the second build found the bundle in the worker's cache.
    assert sorted(p["bundle_cache"] for p in phases) == ["hit", "miss"]
    assert all({"dispatch", "bundle_fetch", "ep_compile", "upload", "sql", "outside_compile"} <= set(p)
               for p in phases), phases
    text = f.cli("status", "--build", str(st.builds[0]["build"])).stdout
    assert "ep_compile" in text and "manifest.json" in text


def test_sigkill_worker_mid_compile_recovers_within_lease_plus_heartbeat(farm_cluster: Farm) -> None:
    f = farm_cluster
    a = f.start_worker("2.51.0")
    b = f.start_worker("2.51.0")  # idle, same toolchain
    f.cli("submit", str(light("vgg19")), "-t", "qnn:SM8650", "--sdk", "2.51.0")
    holder = wait_for(lambda: next((w for w in (a, b) if compile_children(w.pid)), None), 60)
    assert holder is not None, "no worker started compiling"
    (child,) = compile_children(holder.pid)
    killed_at = time.monotonic()
    f.kill(holder)  # SIGKILL to the worker's process group; the compile child has its own session
    assert wait_for(lambda: not alive(child), 5), "the compile child outlived its worker"
    assert f.builds()[0]["state"] == "running"
    rows = f.wait_builds(lambda r: r[0]["attempts"] == 2 and r[0]["state"] == "running", timeout=60)
    recovered = time.monotonic() - killed_at
    # lease 6 s + a heartbeat (1 s) + the reconciler's resend window; ~1 s of slack for this box.
    assert recovered <= 6 + 3 + 5, f"recovery took {recovered:.1f} s"
    rows = f.wait_builds(lambda r: r[0]["state"] in ("succeeded", "failed"), timeout=120)
    assert [(r["state"], r["attempts"]) for r in rows] == [("succeeded", 2)]
    assert len(json.loads(f.cli("ls", "--json").stdout)) == 1


def test_worker_killed_after_taking_the_message_before_claiming(farm_cluster: Farm) -> None:
    import redis as redis_lib

    f = farm_cluster
    a = f.start_worker("2.51.0", extra_env={"CTXFARM_TEST_PAUSE_BEFORE_EXECUTE": "120"})
    f.cli("submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0")
    r = redis_lib.Redis.from_url(f.redis.url)
    assert wait_for(lambda: r.llen("compile.qnn.2.51.0") == 0, 30), "the paused worker did not take the message"
    assert f.builds()[0]["state"] == "queued"
    f.start_worker("2.51.0")
    killed_at = time.monotonic()
    f.kill(a)
    f.wait_builds(lambda rows: rows[0]["state"] == "running" or rows[0]["state"] == "succeeded", timeout=60)
    recovered = time.monotonic() - killed_at
    assert recovered <= 3 + 2 + 5, f"re-send took {recovered:.1f} s"
    rows = f.wait_builds(lambda rows: rows[0]["state"] == "succeeded", timeout=60)
    assert rows[0]["attempts"] == 1


def test_sigterm_worker_releases_the_lease_at_once(farm_cluster: Farm) -> None:
    f = farm_cluster
    a = f.start_worker("2.51.0")
    f.cli("submit", str(light("vgg19")), "-t", "qnn:SM8650", "--sdk", "2.51.0")
    (child,) = wait_for(lambda: compile_children(a.pid), 60)
    work_dir = Path(os.readlink(f"/proc/{child}/cwd"))
    os.kill(a.pid, signal.SIGTERM)
    a.wait(timeout=30)
    assert wait_for(lambda: not alive(child), 5)
    row = f.builds()[0]
    assert (row["state"], row["code"], row["attempts"]) == ("queued", "interrupted", 0)
    assert not work_dir.exists(), "the job's temp dir was left behind"
    f.start_worker("2.51.0")
    rows = f.wait_builds(lambda rows: rows[0]["state"] == "succeeded", timeout=120)
    assert rows[0]["attempts"] == 1


def test_poison_model_fails_with_worker_lost_after_the_cap(farm_cluster: Farm, tmp_path: Path) -> None:
    f = farm_cluster
    w = f.start_worker("2.51.0")
    stop = threading.Event()
    kills: list[int] = []

    def killer() -> None:
        # Every compile of this model dies (as a crashing SDK would): SIGKILL each compile child
        # of the worker this test started (found by PID ancestry, never by name host-wide).
        while not stop.is_set():
            for pid in compile_children(w.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        f.cli("submit", str(conv_relu_add(tmp_path / "poison.onnx", seed=9)), "-t", "qnn:SM8650", "--sdk", "2.51.0")
        rows = f.wait_builds(lambda r: r[0]["state"] == "failed", timeout=120)
    finally:
        stop.set()
        t.join()
    assert [(r["state"], r["code"], r["attempts"]) for r in rows] == [("failed", "worker-lost", 3)]
    assert len(set(kills)) == 3
    status = json.loads(f.cli("status", "--build", str(rows[0]["id"]), "--json").stdout)
    assert "signal 9" in status["error_message"]


def test_deterministic_failure_is_not_retried(farm_cluster: Farm, tmp_path: Path) -> None:
    f = farm_cluster
    f.start_worker("2.51.0", {"FARM_COMPILE_TIMEOUT": "0.01"})  # a time limit no compile meets: resource-limit
    proc = f.cli("submit", str(partly_unsupported(tmp_path / "p.onnx")), "-t", "qnn:SM8650", "--sdk", "2.51.0",
                 "--wait", "--timeout", "120", check=False)
    assert proc.returncode == 1 and "error[resource-limit]" in proc.stderr, proc.stderr
    assert [(r["state"], r["code"], r["attempts"]) for r in f.builds()] == [("failed", "resource-limit", 1)]


def test_full_offload_gate_on_a_release(farm_cluster: Farm, tmp_path: Path) -> None:
    """--require-full-offload is kept with the release, not in the build key: the worker builds
    ungated and publishes; the release answers unsupported-ops naming the CPU op types (submit
    --wait, status, exit 1). A plain release of the model is answered from that build, and so is
    a gated one through the HTTP service: one compile in all."""
    from infra.devfarm.services import free_port
    from tests.common.service import serve

    f = farm_cluster
    f.start_worker("2.51.0")
    model = str(partly_unsupported(tmp_path / "p.onnx"))
    args = ["submit", model, "-t", "qnn:SM8650", "--sdk", "2.51.0", "--wait", "--timeout", "120", "--json"]
    gated = f.cli(*args, "--require-full-offload", check=False)
    assert gated.returncode == 1, gated.stderr
    (b,) = valid("submit", gated.stdout)["builds"]
    assert (b["state"], b["error_code"]) == ("failed", "unsupported-ops") and b["artifact"]
    assert "2 node(s) stay on the CPU (Erf, Mod)" in b["error_message"]
    assert [(r["state"], r["attempts"]) for r in f.builds()] == [("succeeded", 1)]
    status = f.cli("status", str(json.loads(gated.stdout)["release"]), check=False)
    assert status.returncode == 1 and "error[unsupported-ops]" in status.stderr and "(Erf, Mod)" in status.stderr
    plain = valid("submit", f.cli(*args).stdout)
    (p,) = plain["builds"]
    assert (p["state"], p["build"], p["artifact"]) == ("succeeded", b["build"], b["artifact"])
    # Ungated, the partial offload is a warning, not a failure.
    assert (p["nodes_cpu"], p["cpu_op_types"]) == (2, ["Erf", "Mod"])
    assert [(w["code"], w["nodes_cpu"], w["cpu_op_types"]) for w in plain["warnings"]] == [
        ("partial-offload", 2, ["Erf", "Mod"])]
    text = f.cli("status", str(plain["release"]))
    assert "warning[partial-offload] qnn:SM8650: 2 node(s) stay on the CPU (Erf, Mod)" in text.stderr

    submit = f.cli("token", "create", "pipeline", "--scope", "submit").stdout.strip().splitlines()[-1]
    port = free_port()
    server = serve(f.env, port, tmp_path / "serve.log")
    try:
        remote = f.cli(*args, "--require-full-offload", "--server", f"http://127.0.0.1:{port}", "--token", submit,
                       check=False)
        remote_plain = valid("submit", f.cli(*args, "--server", f"http://127.0.0.1:{port}", "--token", submit).stdout)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert remote.returncode == 1, remote.stderr
    (r,) = valid("submit", remote.stdout)["builds"]
    assert (r["state"], r["error_code"], r["build"]) == ("failed", "unsupported-ops", b["build"])
    assert remote_plain["ok"] and remote_plain["builds"][0]["cpu_op_types"] == ["Erf", "Mod"]
    assert [w["code"] for w in remote_plain["warnings"]] == ["partial-offload"]
    assert len(f.builds()) == 1


def test_unserved_toolchain_is_refused_or_queued(farm_cluster: Farm) -> None:
    f = farm_cluster
    f.start_worker("2.51.0")
    model = str(light("squeezenet"))
    refused = f.cli("submit", model, "-t", "qnn:SM8650", "--sdk", "2.49.40", check=False)
    assert refused.returncode != 0 and "error[no-worker]" in refused.stderr and "qnn 2.51.0" in refused.stderr
    assert f.builds() == []
    queued = json.loads(f.cli("submit", model, "-t", "qnn:SM8650", "--sdk", "2.49.40", "--allow-queue",
                              "--json").stdout)
    assert [b["state"] for b in queued["builds"]] == ["queued"]
    f.start_worker("2.49.40")
    rows = f.wait_builds(lambda r: r[0]["state"] == "succeeded")
    assert rows[0]["toolchain"] == "2.49.40"


def test_broker_restart_and_broker_down(farm_cluster: Farm, tmp_path: Path) -> None:
    f = farm_cluster
    f.start_worker("2.51.0")
    # Broker restart: the worker reconnects; a build submitted afterwards runs.
    port = int(f.redis.url.rsplit(":", 1)[1].split("/")[0])
    f.redis.stop()
    f.redis = start_redis(tmp_path / "redis", port=port, persist=True)
    f.cli("submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--wait", "--timeout", "120")
    # Broker down: a clear error, and nothing written anywhere.
    f.redis.stop()
    before = f.builds()
    down = f.cli("submit", str(conv_relu_add(tmp_path / "x.onnx", seed=5)), "-t", "qnn:SM8650", "--sdk", "2.51.0",
                 check=False, timeout=60)
    assert down.returncode != 0 and "unreachable" in down.stderr and "Traceback" not in down.stderr
    assert f.builds() == before
    f.redis = start_redis(tmp_path / "redis", port=port, persist=True)


def test_lost_queue_is_resent_by_the_reconciler(farm_cluster: Farm) -> None:
    import redis as redis_lib

    f = farm_cluster
    queued = json.loads(f.cli("submit", str(light("squeezenet")), "-t", "qnn:SM8750", "--sdk", "2.51.0",
                              "--allow-queue", "--json").stdout)
    assert [b["state"] for b in queued["builds"]] == ["queued"]
    redis_lib.Redis.from_url(f.redis.url).flushall()  # a broker restart without persistence
    f.start_worker("2.51.0")
    rows = f.wait_builds(lambda r: r[0]["state"] == "succeeded", timeout=90)
    assert rows[0]["attempts"] == 1


def test_graph_group_release_on_postgres_and_s3(farm_cluster: Farm, tmp_path: Path) -> None:
    """A weight-shared group through the real cluster (PostgreSQL, Redis, SeaweedFS, QNN 2.47.0
    and 2.51.0 workers): one shared binary per toolchain, described, never probed (the simulator
    can't load it), fetched whole from S3; a multi-SoC build on 2.47.0 refused before anything."""
    from tests.common.groups import prefill_decode

    f = farm_cluster
    f.start_worker("2.47.0")
    f.start_worker("2.51.0")
    prefill, decode = prefill_decode(tmp_path / "m", external=True)
    args = ["submit", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650",
            "--sdk", "2.47.0", "--sdk", "2.51.0", "--name", "llm/tiny", "--tag", "t1", "--wait", "--timeout", "180",
            "--json"]
    out = json.loads(f.cli(*args).stdout)
    assert out["graphs"] == ["prefill", "decode"]
    valid("submit", out)
    assert sorted((b["toolchain"], b["state"]) for b in out["builds"]) == [("2.47.0", "succeeded"),
                                                                          ("2.51.0", "succeeded")]
    time.sleep(3)  # time for the probes the reconciler would send: none may record a verdict
    assert verdicts(f) == {}
    for b in out["builds"]:
        info = json.loads(f.cli("show", b["artifact"], "--json").stdout)
        assert info["description"]["check"].startswith("ok") and "weight-shared" in info["description"]["unverified"]
        assert [g["name"] for g in info["manifest"]["graphs"]] == ["prefill", "decode"]
        (binary,) = info["description"]["binaries"].values()
        assert binary["build_id"].startswith("v" + b["toolchain"])
    dev = tmp_path / "device"
    f.cli("fetch", "--model", "llm/tiny:t1", "--soc", "SM8650", "--qnn", "2.51.0", "--out", str(dev))
    assert sorted(p.name for p in dev.iterdir()) == ["g0_ctx.onnx", "g0_ctx_qnn.bin", "g1_ctx.onnx"]
    again = json.loads(f.cli(*args).stdout)
    assert [b["build"] for b in again["builds"]] == [b["build"] for b in out["builds"]]
    refused = f.cli("submit", str(prefill), "-t", "qnn:SM8650+SM8750", "--sdk", "2.47.0", check=False)
    assert refused.returncode == 2 and "error[multi-soc-unsupported]" in refused.stderr


def test_graph_group_over_http(farm_cluster: Farm, tmp_path: Path) -> None:
    """A pipeline with only a URL and a submit token sends each graph (hash first), names them as
    a group (POST /v1/groups), releases it; a device installs the whole group. The group's digest
    is the one the CLI computes locally from the same files."""
    from farm.core.groups import inspect_group
    from infra.devfarm.services import free_port
    from tests.common.groups import prefill_decode
    from tests.common.service import serve

    f = farm_cluster
    f.start_worker("2.51.0")
    submit = f.cli("token", "create", "pipeline", "--scope", "submit").stdout.strip().splitlines()[-1]
    read = f.cli("token", "create", "fleet", "--scope", "read").stdout.strip().splitlines()[-1]
    port = free_port()
    server = serve(f.env, port, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    bare = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "AWS_"))}
    bare["FARM_HOME"] = str(tmp_path / "nothing-here")
    prefill, decode = prefill_decode(tmp_path / "m", external=True)
    try:
        def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=bare, capture_output=True,
                                  text=True, timeout=300, stdin=subprocess.DEVNULL)
            assert not check or proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
            return proc

        group = ["--graph", f"prefill={prefill}", "--graph", f"decode={decode}"]
        st = json.loads(cli("submit", *group, "-t", "qnn:SM8650", "--sdk", "2.51.0", "--name", "llm/tiny", "--tag",
                            "t1", "--wait", "--timeout", "240", "--server", url, "--token", submit, "--json").stdout)
        assert st["ok"] and st["graphs"] == ["prefill", "decode"]
        assert st["model"] == inspect_group([("prefill", str(prefill)), ("decode", str(decode))]).digest
        dest = tmp_path / "device"
        got = json.loads(cli("install", "--server", url, "--token", read, "--model", "llm/tiny:t1", "--soc",
                             "SM8650", "--qnn", "2.51.0", "--dest", str(dest), "--json").stdout)
        assert sorted(p.name for p in dest.iterdir()) == ["g0_ctx.onnx", "g0_ctx_qnn.bin", "g1_ctx.onnx"]
        assert got["bytes"] > 0
        refused = cli("submit", *group, "-t", "qnn:SM8450", "--sdk", "2.51.0", "--server", url, "--token", submit,
                      check=False)
        assert refused.returncode == 2 and "error[sharing-unsupported]" in refused.stderr, refused.stderr
        dup = cli("submit", "--graph", f"a={prefill}", "--graph", f"a={decode}", "-t", "qnn:SM8650", "--server", url,
                  "--token", submit, check=False)
        assert dup.returncode == 2 and "error[bad-group]" in dup.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_database_down_is_a_clear_error(tmp_path: Path) -> None:
    from infra.devfarm.services import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({"FARM_HOME": str(tmp_path), "FARM_BROKER_URL": "redis://127.0.0.1:6379/15",
                "FARM_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x",
                "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}"})
    proc = subprocess.run([sys.executable, "-m", "farm.cli", "submit", str(light("squeezenet")), "-t", "qnn:SM8650",
                           "--sdk", "2.51.0"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "error[database-error]" in proc.stderr and "unreachable" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "blobs" / "blobs").exists(), "nothing uploaded when the index is down"


def test_http_end_to_end_upload_submit_build_install_load(farm_cluster: Farm, tmp_path: Path) -> None:
    """The real stack behind `farm serve`: a pipeline with only a URL and a submit token uploads
    and releases; a device with only a URL and a read token installs into an empty directory and
    the context loads with onnxruntime-qnn."""
    f = farm_cluster
    f.start_worker("2.51.0")
    # Neither the pipeline nor the device has database, broker or store settings or credentials.
    with f.over_http(tmp_path, fleet="pixel-fleet") as h:
        url, submit, read, cli, bare = h.url, h.submit, h.read, h.cli, h.env
        st = json.loads(cli("submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--name",
                            "vision/sq", "--tag", "stable", "--wait", "--timeout", "240", "--server", url,
                            "--token", submit, "--json").stdout)
        assert st["ok"] and [b["state"] for b in st["builds"]] == ["succeeded"]
        valid("submit", st)  # the same document as a local submit
        dest = tmp_path / "device" / "sq"
        got = valid("install", cli("install", "--server", url, "--token", read, "--model", "vision/sq:stable",
                                   "--soc", "SM8650", "--qnn", "2.51.0", "--dest", str(dest), "--json").stdout)
        assert Path(got["ctx_model"]) == dest / "model_ctx.onnx" and got["bytes"] > 0
        loaded = json.loads(cli("load-check", got["ctx_model"], "--target", "qnn:SM8650", "--json").stdout)
        assert loaded["load_seconds"] > 0 and loaded["outputs"]
        status = valid("status", cli("status", str(st["release"]), "--server", url, "--token", read, "--json").stdout)
        assert status["ok"] and status["counts"] == {"succeeded": 1}
        one = valid("status", cli("status", "--build", str(st["builds"][0]["build"]), "--server", url, "--token",
                                  read, "--json").stdout)
        assert one["state"] == "succeeded" and "log" not in one  # the log only with --log
        # A read token can't submit.
        refused = subprocess.run([sys.executable, "-m", "farm.cli", "submit", str(light("squeezenet")), "-t",
                                  "qnn:SM8650", "--sdk", "2.51.0", "--server", url, "--token", read], env=bare,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and "error[forbidden]" in refused.stderr


def test_submit_wait_shows_each_build_change_and_json_is_typed(farm_cluster: Farm, tmp_path: Path) -> None:
    """`farm submit --wait` in a pipe: one plain line per build state change (no dict, no escape
    sequence); on a terminal, a live table; then status as a table, and typed JSON."""
    from tests.common.cli import in_pty

    f = farm_cluster
    f.start_worker("2.51.0")
    args = ["submit", str(light("squeezenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--sdk", "2.51.0",
            "--name", "sq", "--wait", "--timeout", "240"]
    proc = f.cli(*args)
    assert "\x1b" not in proc.stdout + proc.stderr and "{'" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert re.fullmatch(r"release \d+ \(sq:latest\): 2 build\(s\): 2 queued", lines[0]), lines
    for target in ("qnn:SM8650", "qnn:SM8750"):
        mine = [line for line in lines if f" {target} 2.51.0: " in line]
        # how long it ran, as this waiter saw it
        assert re.fullmatch(rf"  build \d+ {target} 2\.51\.0: succeeded after \d+\.\d s", mine[-1]), lines
        assert len(mine) == len(set(mine)) <= 3  # queued, running, succeeded: each at most once
    assert re.search(r"^BUILD\s+TARGET\s+TOOLCHAIN\s+STATE", proc.stdout, re.M)

    again = valid("submit", f.cli(*args, "--json").stdout)  # answered from the index
    assert again["ok"] and again["done"] and again["counts"] == {"succeeded": 2}
    assert all(isinstance(b["compile_seconds"], float) for b in again["builds"])
    release = str(again["release"])
    assert valid("status", f.cli("status", release, "--json").stdout)["builds"] == again["builds"]
    text = f.cli("status", release).stdout
    assert text.startswith(f"release {release} (sq:latest): 2 build(s): 2 succeeded\n") and "None" not in text
    one = valid("status", f.cli("status", "--build", str(again["builds"][0]["build"]), "--log", "--json").stdout)
    assert "onnxruntime" in one["log"] and "\x1b" not in one["log"]  # the EP colours its lines; not kept
    assert "\x1b" not in (f.tmp / "worker-2.51.0-0.log").read_text(errors="replace")  # nor in the worker's log
    workers = valid("workers", f.cli("workers", "--json").stdout)
    assert workers[0]["queues"] and all(isinstance(q, str) for q in workers[0]["queues"])
    assert workers[0]["started_at"].endswith("Z") and isinstance(workers[0]["last_seen_seconds"], float)

    # On a terminal: the live table, redrawn while the worker compiles.
    rc, out = in_pty(f.env, "submit", str(light("shufflenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0",
                     "--wait", "--timeout", "240")
    plain = re.sub(r"\x1b\[[0-?]*[ -/]*[@-~]", "", out)
    assert rc == 0, plain
    assert "\x1b[" in out and "ELAPSED" in plain and "ATTEMPTS" in plain, plain
    assert re.search(r"qnn:SM8650\s+2\.51\.0\s+succeeded\s+1\s+\d+\.\d s", plain), plain


def test_cancel_a_running_and_a_queued_build(farm_cluster: Farm) -> None:
    """farm cancel on a release: the worker's running compile is killed within its
    lease renewal, the queued build's message is dropped when the worker takes it, the worker
    goes on to the next build, and submitting again queues the cancelled builds again."""
    f = farm_cluster
    a = f.start_worker("2.51.0")  # one compile at a time: one build runs, the other waits
    out = json.loads(f.cli("submit", str(light("vgg19")), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--sdk", "2.51.0",
                           "--json").stdout)
    (child,) = wait_for(lambda: compile_children(a.pid), 60)
    answer = json.loads(f.cli("cancel", str(out["release"]), "--json").stdout)
    # Counted from the cancel's answer, not from before the CLI started (its own start-up is not
    # the worker's reaction): the worker renews its lease every 2 s and kills the compile at the
    # first renewal that finds the build cancelled, so it must be gone well before the lease
    # (6 s) could run out once; a loaded box (load 8 seen) adds scheduling delay, not renewals.
    cancelled_at = time.monotonic()
    assert sorted(r["was"] for r in answer["builds"]) == ["queued", "running"]
    assert [r["now"] for r in answer["builds"]] == ["cancelled", "cancelled"]
    assert wait_for(lambda: not alive(child), 10), "the compile outlived its cancel"
    stopped = time.monotonic() - cancelled_at
    assert stopped <= 6, f"the running compile took {stopped:.1f} s to stop after the cancel answered"
    rows = f.builds()
    assert [(r["state"], r["code"]) for r in rows] == [("failed", "cancelled")] * 2
    # The worker is free: the next build runs; the cancelled ones stay cancelled meanwhile.
    f.cli("submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--wait", "--timeout", "120")
    assert [(r["state"], r["code"]) for r in f.builds()[:2]] == [("failed", "cancelled")] * 2
    again = json.loads(f.cli("submit", str(light("vgg19")), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--json").stdout)
    assert again["builds"][0]["state"] in ("queued", "running")  # a cancel is not a verdict
    assert a.poll() is None


def test_accuracy_gate_on_a_release(farm_cluster: Farm, tmp_path: Path) -> None:
    """--min-psnr on a cluster release: the worker publishes, then checks the context on
    the simulator in a follow-up task on its probe queue; the release waits for it and answers
    accuracy-below-threshold for the overflowing model, naming the output. A gated re-submission
    of the built model runs no compile and no second check."""
    from tests.common.accuracy_models import matmul_model

    f = farm_cluster
    f.start_worker("2.51.0")
    out = {}
    for name, overflow in (("plain", False), ("overflow", True)):
        model = str(matmul_model(tmp_path / f"{name}.onnx", overflow=overflow))
        proc = f.cli("submit", model, "-t", "qnn:SM8650", "--sdk", "2.51.0", "--min-psnr", "30", "--wait",
                     "--timeout", "180", "--json", check=False)
        out[name] = (proc.returncode, valid("submit", proc.stdout)["builds"][0], proc.stderr)
    rc, b, _ = out["plain"]
    assert rc == 0 and b["state"] == "succeeded", out["plain"]
    rc, b, err = out["overflow"]
    assert rc == 1 and (b["state"], b["error_code"]) == ("failed", "accuracy-below-threshold"), out["overflow"]
    assert "output 'y'" in b["error_message"] and b["artifact"]
    again = f.cli("submit", str(tmp_path / "overflow.onnx"), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--min-psnr",
                  "5", "--wait", "--timeout", "60", "--json")
    assert valid("submit", again.stdout)["builds"][0]["state"] == "succeeded"
    assert [r["attempts"] for r in f.builds()] == [1, 1]
    from sqlalchemy import text

    reg = f.db()
    try:
        with reg.db.session() as s:
            assert s.execute(text("SELECT count(*) FROM accuracy_results")).scalar() == 2
    finally:
        reg.close()



def test_a_worker_takes_its_queue_from_the_index_and_clears_the_messages(farm_cluster: Farm) -> None:
    """Builds queued before the worker starts are run one after another by the task of
    the first message (``workers.tasks._next_builds``): each once, the later ones taken from the
    index, and their messages taken out of the broker list (none left for a worker to start a
    task on)."""
    import redis as redis_lib

    f = farm_cluster
    out = json.loads(f.cli("submit", str(light("squeezenet")), "-t", "qnn:SM8650", "-t", "qnn:SM8750",
                           "-t", "qnn:SC8380XP", "--sdk", "2.51.0", "--allow-queue", "--json").stdout)
    r = redis_lib.Redis.from_url(f.redis.url)
    assert r.llen("compile.qnn.2.51.0") == 3
    f.start_worker("2.51.0")
    rows = f.wait_builds(lambda rows: all(x["state"] == "succeeded" for x in rows), timeout=120)
    assert [x["attempts"] for x in rows] == [1, 1, 1]
    assert wait_for(lambda: r.llen("compile.qnn.2.51.0") == 0, 10)
    phases = [json.loads(f.cli("status", "--build", str(b["build"]), "--json").stdout)["phases"]
              for b in out["builds"]]
    assert sorted(p.get("taken_from", "broker") for p in phases) == ["broker", "index", "index"], phases
    # the publication of each build waited for the next one's compile to start, not longer
    assert all(p["publish_yield"] < 1000 for p in phases), phases


def test_a_worker_places_its_next_builds_model_while_it_compiles(farm_cluster: Farm) -> None:
    """The queue's next build is another model's; its snapshot is placed in the worker's
    bundle cache during the build before it (``Executor._prefetch_next``), so its own claim finds
    it there: a hit, though that model never went through this worker before."""
    f = farm_cluster
    first = json.loads(f.cli("submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0",
                             "--allow-queue", "--json").stdout)
    second = json.loads(f.cli("submit", str(light("inception_v1")), "-t", "qnn:SM8650", "--sdk", "2.51.0",
                              "--allow-queue", "--json").stdout)
    f.start_worker("2.51.0")
    f.wait_builds(lambda rows: all(x["state"] == "succeeded" for x in rows), timeout=120)
    cache = [json.loads(f.cli("status", "--build", str(st["builds"][0]["build"]), "--json").stdout)["phases"]
             ["bundle_cache"] for st in (first, second)]
    assert cache == ["miss", "hit"], cache
