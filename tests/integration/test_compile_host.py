"""Warm compile hosts with the real QNN SDK (workers.host): the bytes of a fresh process, a real
SDK segfault and the memory cap in a forked job (the host survives), and embedded ``farm build``
compiling several targets in parallel in warm hosts, interrupted and killed."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from farm.core.catalog import parse_target
from farm.core.errors import ResourceLimitError
from farm.core.settings import Settings
from farm.pipeline.plan import build
from registry.index import Registry
from registry.models import Build
from tests.common.onnx_models import conv_relu_add, light, memory_bomb
from tests.common.procs import alive, compile_children, compile_hosts, descendants, recorded_states, standbys, wait_for
from workers.host import pool_for
from workers.qnn.runner import CHILD, QnnRunner, provider_options
from workers.runner import CompileJob


def compile_bins(runner: QnnRunner, model: Path, ref: str, work: Path, *, memory_mb: int = 6144) -> dict[str, str]:
    out = runner.compile(CompileJob(model, parse_target(ref), {}, 600, memory_mb, verify_load=True), work)
    assert out.self_load and out.self_load["ok"], out.self_load
    return {f.name: hashlib.sha256(f.path.read_bytes()).hexdigest() for f in out.files}


def test_a_warm_host_writes_the_bytes_a_fresh_child_writes(tmp_path: Path) -> None:
    """A process that compiled once writes different bytes for the next compile (measured); a
    job forked from the host must not: same inputs, same bytes as a fresh child, every time."""
    model = light("squeezenet")
    cold = {ref: compile_bins(QnnRunner(warm_host=False), model, ref, tmp_path / f"cold-{i}")
            for i, ref in enumerate(("qnn:SM8650", "qnn:SM8750"))}
    warm = QnnRunner()
    for i, ref in enumerate(("qnn:SM8650", "qnn:SM8750", "qnn:SM8650")):
        assert compile_bins(warm, model, ref, tmp_path / f"warm-{i}") == cold[ref], ref
    assert pool_for(CHILD).idle_pids(), "the warm runner left no host to reuse"


def test_the_bytes_do_not_depend_on_the_directory_the_bundle_sits_in(tmp_path: Path) -> None:
    """onnxruntime hashes the model path into the EPContext partition name (measured: the same
    model from /a and /b gave other bytes), and every job fetches its bundle into another
    directory: the child compiles from the model's own directory, so only content counts, with
    external data too."""
    bins = []
    for where in ("first/deep/dir", "second"):
        (tmp_path / where).mkdir(parents=True)
        model = conv_relu_add(tmp_path / where / "model.onnx", external=True)
        assert len(list(model.parent.iterdir())) == 2, "the model must carry external data"
        bins.append(compile_bins(QnnRunner(), model, "qnn:SM8650", tmp_path / f"work-{len(bins)}"))
    assert bins[0] == bins[1]


def test_an_sdk_segfault_in_a_job_leaves_the_host_serving(tmp_path: Path) -> None:
    """light_inception_v1 for SM8650 loads on the x86_64 HTP simulator and segfaults when run
    (measured): run it in a job of the warm host, then compile in the same host."""
    pool = pool_for(CHILD)
    runner = QnnRunner()
    compile_bins(runner, light("inception_v1"), "qnn:SM8650", tmp_path / "build")
    (host,) = pool.idle_pids()
    request = {"ctx_model": str(tmp_path / "build" / "out" / "model_ctx.onnx"),
               "provider_options": provider_options(parse_target("qnn:SM8650"), {})}
    (tmp_path / "load").mkdir()
    result, _wall, log, _t = pool.run("load", request, tmp_path / "load", timeout=300)
    assert result["load_seconds"] > 0 and result["crashed"] == "signal 11 (SIGSEGV)", log
    assert pool.idle_pids() == [host] and alive(host)
    compile_bins(runner, light("squeezenet"), "qnn:SM8750", tmp_path / "after")
    assert pool.idle_pids() == [host]


def test_the_memory_cap_is_a_resource_limit_in_a_warm_job(tmp_path: Path) -> None:
    pool = pool_for(CHILD)
    runner = QnnRunner()
    compile_bins(runner, light("squeezenet"), "qnn:SM8650", tmp_path / "warm-up")
    (host,) = pool.idle_pids()
    with pytest.raises(ResourceLimitError):
        compile_bins(runner, memory_bomb(tmp_path / "bomb.onnx"), "qnn:SM8650", tmp_path / "bomb", memory_mb=1536)
    assert pool.idle_pids() == [host]
    compile_bins(runner, light("squeezenet"), "qnn:SM8750", tmp_path / "after")


@pytest.mark.parametrize("warm", [True, False], ids=["warm-job", "fresh-child"])
def test_a_cap_below_what_the_process_maps_is_refused_not_hung(tmp_path: Path, warm: bool) -> None:
    """FARM_COMPILE_MEMORY_MB=1 once left a forked job waiting on a lock forever (every
    allocation failed); a cap below the process's own mapping is refused with the figures."""
    with pytest.raises(ResourceLimitError, match="below what the compile process maps"):
        compile_bins(QnnRunner(warm_host=warm), light("squeezenet"), "qnn:SM8650", tmp_path / "tiny", memory_mb=1)


def test_embedded_build_compiles_targets_in_parallel_in_warm_hosts(settings: Settings, tmp_path: Path) -> None:
    pool = pool_for(CHILD)
    first = build(settings, conv_relu_add(tmp_path / "a.onnx", seed=21), ["qnn:SM8650", "qnn:SM8750"])
    assert [o.state for o in first.outcomes] == ["built", "built"]
    started = pool.started
    assert len(pool.idle_pids()) >= 1
    # Another model, three targets: the hosts are reused, no process is started per target.
    again = build(settings, conv_relu_add(tmp_path / "b.onnx", seed=22), ["qnn:SM8650", "qnn:SM8750", "qnn:SM8550"])
    assert [(o.target, o.state) for o in again.outcomes] == [("qnn:SM8650", "built"), ("qnn:SM8750", "built"),
                                                            ("qnn:SM8550", "built")]
    assert pool.started == started


def rows(settings: Settings) -> list[tuple[str, int, str | None]]:
    from sqlalchemy import select

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return [(b.state, b.attempts, b.error_code) for b in s.scalars(select(Build).order_by(Build.id))]
    finally:
        reg.close()


def start_parallel_build(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    proc = subprocess.Popen([sys.executable, "-m", "farm.cli", "build", str(light("vgg19")), "-t", "qnn:SM8650",
                             "-t", "qnn:SM8750"], env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    jobs = wait_for(lambda: (j if len(j := compile_children(proc.pid)) == 2 else None), 120)
    assert jobs, f"two compiles never ran at once: {log.read_text()}"
    return proc, jobs


def test_sigterm_of_a_parallel_farm_build_releases_every_build(settings: Settings, farm_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    proc, jobs = start_parallel_build(farm_env, tmp_path / "build.log")
    # The compiles start before the builds are recorded (farm.pipeline.early): SIGTERM once both
    # builds are claimed, their compiles adopted.
    assert wait_for(lambda: recorded_states(settings.home) == ["running", "running"], 120)
    assert compile_children(proc.pid) == jobs
    hosts = compile_hosts(proc.pid)
    work_dirs = [Path(os.readlink(f"/proc/{j}/cwd")) for j in jobs]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    out = (tmp_path / "build.log").read_text()
    assert "error[interrupted]" in out and "Traceback" not in out
    assert wait_for(lambda: not any(alive(p) for p in jobs + hosts), 5), "a compile job or host outlived farm build"
    assert not any(d.exists() for d in work_dirs), "a job's temp dir was left behind"
    assert rows(settings) == [("queued", 0, "interrupted"), ("queued", 0, "interrupted")]


def test_sigterm_before_the_builds_are_recorded_stops_the_early_compiles(settings: Settings,
                                                                         farm_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """SIGTERM while the compiles started early run and nothing is recorded yet (here: the
    pipeline's import held back): interrupted, every job and host gone, their dirs removed,
    nothing in the index."""
    hold = tmp_path / "sitecustomize.py"  # the pipeline's import waits: the early phase lasts
    hold.write_text("import builtins, time\n_imp = builtins.__import__\n"
                    "def _slow(name, *a, **k):\n"
                    "    if name == 'farm.pipeline.plan':\n        time.sleep(60)\n"
                    "    return _imp(name, *a, **k)\n"
                    "builtins.__import__ = _slow\n")
    root = str(Path(__file__).resolve().parents[2])
    env = {**farm_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), farm_env.get("PYTHONPATH") or root])}
    proc, jobs = start_parallel_build(env, tmp_path / "build.log")
    hosts = compile_hosts(proc.pid)
    work_dirs = [Path(os.readlink(f"/proc/{j}/cwd")).parent for j in jobs]
    assert recorded_states(settings.home) == []
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    out = (tmp_path / "build.log").read_text()
    assert "error[interrupted]" in out and "Traceback" not in out
    assert wait_for(lambda: not any(alive(p) for p in jobs + hosts), 5), "a compile job or host outlived farm build"
    assert not any(d.exists() for d in work_dirs), "an early compile's dir was left behind"
    assert recorded_states(settings.home) == []


def test_sigkill_of_a_parallel_farm_build_kills_hosts_and_jobs(settings: Settings, farm_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    proc, jobs = start_parallel_build(farm_env, tmp_path / "build.log")
    assert wait_for(lambda: recorded_states(settings.home) == ["running", "running"], 120)  # claimed, compiles adopted
    hosts = compile_hosts(proc.pid)
    # One host for the call (onnxruntime imported once): both compiles are forks of it.
    assert len(hosts) == 1 and set(jobs) <= set(descendants(hosts[0]))
    ahead = wait_for(lambda: standbys(proc.pid), 5)  # the host's next job, forked ahead
    assert ahead, "no standby was forked"
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not any(alive(p) for p in jobs + hosts + ahead), 5), \
        "a compile job, standby or host outlived farm build"
    assert [r[0] for r in rows(settings)] == ["running", "running"]  # until their leases lapse


def test_a_lease_taken_over_mid_compile_stops_the_job(settings: Settings, tmp_path: Path) -> None:
    """The executor's lease renewal finds the lease taken (a reconciler gave the build to another
    executor): the running job is killed, nothing is published, and once the taker's lease
    lapses the same ``farm build`` claims the build again and finishes it."""
    import dataclasses
    import threading
    from datetime import timedelta

    from sqlalchemy import update

    from farm.pipeline import states

    quick = dataclasses.replace(settings, lease_seconds=0.9)
    outcome: list[object] = []
    t = threading.Thread(target=lambda: outcome.append(build(quick, light("vgg19"), ["qnn:SM8650"]).outcomes[0]))
    t.start()
    (job,) = wait_for(lambda: compile_children(os.getpid()), 120)
    work_dir = Path(os.readlink(f"/proc/{job}/cwd"))
    reg = Registry.open(quick)
    try:
        with reg.db.session() as s:
            s.execute(update(Build).values(lease_owner="another-executor",
                                           lease_expires_at=states.now() + timedelta(seconds=2)))
    finally:
        reg.close()
    assert wait_for(lambda: not alive(job), 5), "the job outlived the lost lease"
    assert wait_for(lambda: not work_dir.exists(), 5), "the lost attempt's temp dir was left behind"
    t.join(300)
    (o,) = outcome
    assert o.state == "built"  # type: ignore[attr-defined]
    assert rows(quick) == [("succeeded", 2, None)]
