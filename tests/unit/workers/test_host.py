"""The warm compile host (workers.host + workers.childproc.serve_host) with a fake backend child
(tests.common.fake_child): crash isolation, the memory cap, cancel, timeouts, recycling, hosts
started from threads, and no process outliving its owner (SIGKILL, SIGTERM, a normal exit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from farm.core.errors import BadOptionsError, LeaseLostError, ResourceLimitError, ToolchainError, WorkerLostError
from tests.common.procs import _ppid as parent
from tests.common.procs import alive, comm, descendants, standbys, wait_for
from workers.host import CompileHost, HostPool

FAKE = "tests.common.fake_child"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pool():  # type: ignore[no-untyped-def]
    p = HostPool(FAKE)
    yield p
    p.close()


def job_dir(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    return d


def jobs_of(host_pid: int) -> list[int]:
    """The host's running job, once it has named itself (a standby, the next job's process
    forked ahead, is named ctxfarm-standby, and for a moment after its fork not at all)."""
    return [p for p in descendants(host_pid) if alive(p) and comm(p) == "ctxfarm-compile"]


def run(pool: HostPool, tmp_path: Path, name: str, **request: object) -> dict[str, object]:
    result, _wall, _log, _timings = pool.run("compile", dict(request), job_dir(tmp_path, name), timeout=60)
    return result


def test_a_job_is_a_fork_of_the_preloaded_host_in_its_work_dir(pool: HostPool, tmp_path: Path) -> None:
    pool.warm(1)
    (host_pid,) = pool.idle_pids()
    result = run(pool, tmp_path, "a", action="ok")
    assert result["ppid"] == host_pid and result["pid"] != host_pid
    assert result["preloaded_in"] == [host_pid]  # the import happened once, in the host
    assert result["cwd"] == str(tmp_path / "a") and result["comm"] == "ctxfarm-compile"
    # Told done once the result is written; the host reaps the job right after.
    assert wait_for(lambda: not alive(int(result["pid"])), 5)  # type: ignore[call-overload]
    assert (tmp_path / "a" / "compile.log").read_text().startswith("fake compile: ok")


def test_a_segfaulting_job_is_worker_lost_and_the_host_serves_the_next(pool: HostPool, tmp_path: Path) -> None:
    pool.warm(1)
    (host_pid,) = pool.idle_pids()
    with pytest.raises(WorkerLostError) as err:
        run(pool, tmp_path, "crash", action="segv")
    assert "signal 11 (SIGSEGV)" in err.value.message and "fake compile: segv" in err.value.details["log"]
    assert pool.idle_pids() == [host_pid] and alive(host_pid)
    assert run(pool, tmp_path, "next", action="ok")["ppid"] == host_pid
    assert pool.started == 1


def test_a_job_killed_from_outside_is_worker_lost(pool: HostPool, tmp_path: Path) -> None:
    pool.warm(1)
    (host_pid,) = pool.idle_pids()
    killed: list[int] = []

    def killer() -> None:
        jobs = wait_for(lambda: jobs_of(host_pid), 30)
        for p in jobs:
            os.kill(p, signal.SIGKILL)
            killed.append(p)

    t = threading.Thread(target=killer)
    t.start()
    with pytest.raises(WorkerLostError, match=r"signal 9 \(SIGKILL\)"):
        run(pool, tmp_path, "poison", action="sleep", seconds=60)
    t.join()
    assert killed and alive(host_pid)
    assert run(pool, tmp_path, "next", action="ok")["ppid"] == host_pid


def test_the_memory_cap_holds_per_job(pool: HostPool, tmp_path: Path) -> None:
    with pytest.raises(ResourceLimitError, match="MemoryError"):
        pool.run("compile", {"action": "alloc", "mb": 1024}, job_dir(tmp_path, "big"), timeout=60, memory_mb=400)
    # A C++ allocation refused under the cap aborts the job: still resource-limit, from the log.
    with pytest.raises(ResourceLimitError, match="ran out of memory under its cap of 400 MiB"):
        pool.run("compile", {"action": "bad_alloc"}, job_dir(tmp_path, "abort"), timeout=60, memory_mb=400)
    # The cap is the job's, not the host's: the same allocation passes without it.
    result, *_ = pool.run("compile", {"action": "alloc", "mb": 1024}, job_dir(tmp_path, "uncapped"), timeout=60)
    assert result["ok"] and pool.started == 1


def test_errors_keep_their_codes(pool: HostPool, tmp_path: Path) -> None:
    with pytest.raises(BadOptionsError, match="QNN_DEVICE_ERROR_INVALID_CONFIG"):
        run(pool, tmp_path, "bad", action="fail")


def test_cancel_kills_the_job_before_returning(tmp_path: Path) -> None:
    host = CompileHost.start(FAKE)
    try:
        cancel = threading.Event()
        seen: list[int] = []

        def lose_the_lease() -> None:
            pid = wait_for(lambda: host.job_pid, 30)
            seen.append(pid)
            cancel.set()

        t = threading.Thread(target=lose_the_lease)
        t.start()
        with pytest.raises(LeaseLostError):
            host.run("compile", {"action": "sleep"}, job_dir(tmp_path, "c"), timeout=600, cancel=cancel)
        t.join()
        assert seen and not alive(seen[0]), "the job outlived the cancel"
        assert host.alive()
        result, *_ = host.run("compile", {"action": "ok"}, job_dir(tmp_path, "after"), timeout=60)
        assert result["ppid"] == host.pid
    finally:
        host.close()


def test_a_flag_set_before_starts_nothing_and_one_set_as_the_job_starts_stops_even_a_short_job(
        tmp_path: Path) -> None:
    """The flag is read before the job is asked for (set: no job, "not started") and as the job
    starts: a job shorter than one CANCEL_POLL is stopped too, never reported as done."""
    host = CompileHost.start(FAKE)
    pids: list[int] = []

    class AtStart:
        def __init__(self) -> None:
            self.reads = 0

        def is_set(self) -> bool:
            self.reads += 1
            if host.job_pid:
                pids.append(host.job_pid)
            return self.reads > 1

    try:
        done = threading.Event()
        done.set()
        with pytest.raises(LeaseLostError, match="not started"):
            host.run("compile", {"action": "ok"}, job_dir(tmp_path, "a"), timeout=60, cancel=done)
        assert host.jobs == 0 and not pids
        flag = AtStart()
        with pytest.raises(LeaseLostError, match="stopped"):
            host.run("compile", {"action": "ok"}, job_dir(tmp_path, "b"), timeout=60, cancel=flag)
        assert flag.reads == 2 and pids and not alive(pids[0])
        assert host.alive()
        result, *_ = host.run("compile", {"action": "ok"}, job_dir(tmp_path, "c"), timeout=60)
        assert result["ppid"] == host.pid
    finally:
        host.close()


def test_the_time_limit_is_a_resource_limit(pool: HostPool, tmp_path: Path) -> None:
    with pytest.raises(ResourceLimitError, match="time limit of 0.3 s"):
        pool.run("compile", {"action": "sleep"}, job_dir(tmp_path, "slow"), timeout=0.3)
    assert pool.started == 1 and len(pool.idle_pids()) == 1


def test_an_exception_in_the_caller_kills_the_job(tmp_path: Path) -> None:
    host = CompileHost.start(FAKE)
    seen: list[int] = []

    class Boom(BaseException):
        pass

    class Flag:
        def is_set(self) -> bool:  # called by the waiting loop: raise as a signal handler would
            if host.job_pid:
                seen.append(host.job_pid)
                raise Boom()
            return False

    try:
        with pytest.raises(Boom):
            host.run("compile", {"action": "sleep"}, job_dir(tmp_path, "x"), timeout=600, cancel=Flag())
        assert seen and not alive(seen[0]) and host.alive()
    finally:
        host.close()


def test_a_dead_host_is_worker_lost_and_replaced(pool: HostPool, tmp_path: Path) -> None:
    pool.warm(1)
    (host_pid,) = pool.idle_pids()
    jobs: list[int] = []

    def kill_host() -> None:
        got = wait_for(lambda: jobs_of(host_pid), 30)
        jobs.extend(got)
        os.kill(host_pid, signal.SIGKILL)

    t = threading.Thread(target=kill_host)
    t.start()
    with pytest.raises(WorkerLostError, match="compile host died"):
        run(pool, tmp_path, "orphan", action="sleep", seconds=60)
    t.join()
    assert jobs and wait_for(lambda: not any(alive(p) for p in jobs), 5), "the job outlived its host (PDEATHSIG)"
    result = run(pool, tmp_path, "next", action="ok")
    assert result["ppid"] != host_pid and pool.started == 2


def test_hosts_are_recycled_after_max_jobs(tmp_path: Path) -> None:
    pool = HostPool(FAKE, max_jobs=2)
    try:
        parents = [run(pool, tmp_path, f"j{i}", action="ok")["ppid"] for i in range(3)]
        assert parents[0] == parents[1] != parents[2]
        assert not alive(int(parents[0]))  # type: ignore[call-overload]
        assert pool.started == 2
    finally:
        pool.close()


def test_parallel_callers_beyond_a_hosts_slots_get_their_own_hosts_and_a_thread_may_end(tmp_path: Path) -> None:
    pool = HostPool(FAKE, slots=1)
    barrier = threading.Barrier(2)
    results: dict[str, dict[str, object]] = {}

    def build(name: str) -> None:
        barrier.wait()
        results[name] = run(pool, tmp_path, name, action="sleep", seconds=1)

    try:
        threads = [threading.Thread(target=build, args=(n,)) for n in ("x", "y")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results["x"]["ppid"] != results["y"]["ppid"] and pool.started == 2
        # Both hosts were started from threads that have ended: they must still be there
        # (PR_SET_PDEATHSIG follows the thread that started a process; ours start on a spawner thread).
        assert set(pool.idle_pids()) == {results["x"]["ppid"], results["y"]["ppid"]}
        assert all(alive(p) for p in pool.idle_pids())
        assert run(pool, tmp_path, "main", action="ok")["ppid"] in pool.idle_pids()
    finally:
        pool.close()


def test_parallel_callers_share_one_host_with_free_slots(tmp_path: Path) -> None:
    """Two callers at once, slots for both: one host (one SDK import), two jobs forked from it
    running side by side, each with its own result; the host serves the next job after."""
    pool = HostPool(FAKE, slots=2)
    barrier = threading.Barrier(2)
    results: dict[str, dict[str, object]] = {}

    def build(name: str) -> None:
        barrier.wait()
        results[name] = run(pool, tmp_path, name, action="sleep", seconds=3)

    try:
        threads = [threading.Thread(target=build, args=(n,)) for n in ("x", "y")]
        for t in threads:
            t.start()
        def running() -> list[int]:
            return [p for p in descendants(os.getpid()) if alive(p) and comm(p) == "ctxfarm-compile"]

        assert wait_for(lambda: len(running()) == 2, 30), "the two jobs did not run at once"
        hosts = {parent(p) for p in running()}
        assert len(hosts) == 1, "the two jobs are not forks of one host"
        host = hosts.pop()
        for t in threads:
            t.join()
        assert pool.started == 1
        assert results["x"]["ppid"] == results["y"]["ppid"] == host
        assert results["x"]["pid"] != results["y"]["pid"]
        assert results["x"]["cwd"] != results["y"]["cwd"]
        assert run(pool, tmp_path, "next", action="ok")["ppid"] == host
    finally:
        pool.close()


def test_a_failing_job_beside_a_running_one_leaves_it_running(tmp_path: Path) -> None:
    """A segfault in one of two concurrent jobs of a host is that job's worker-lost; the other
    finishes with its result."""
    pool = HostPool(FAKE, slots=2)
    pool.warm(1)
    results: dict[str, object] = {}

    def slow() -> None:
        results["slow"] = run(pool, tmp_path, "slow", action="sleep", seconds=2)

    try:
        t = threading.Thread(target=slow)
        t.start()
        host = pool.idle_pids()[0]
        assert wait_for(lambda: len(jobs_of(host)) == 1, 30)
        with pytest.raises(WorkerLostError):
            run(pool, tmp_path, "crash", action="segv")
        t.join()
        assert results["slow"]["ppid"] == host and pool.started == 1  # type: ignore[index]
    finally:
        pool.close()


def test_a_host_that_cannot_preload_is_a_toolchain_error() -> None:
    pool = HostPool(FAKE, env={"FAKE_CHILD_PRELOAD_FAILS": "1"})
    with pytest.raises(ToolchainError, match="no SDK in this environment"):
        pool.warm(1)
    assert pool.idle_pids() == []


OWNER = """
import sys, threading
from pathlib import Path
from workers.host import pool_for
pool = pool_for("tests.common.fake_child")
pool.warm(1)
print(pool.idle_pids()[0], flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
pool.run("compile", {"action": "sleep"}, Path(sys.argv[2]), timeout=600)
"""


def start_owner(mode: str, work: Path) -> tuple[subprocess.Popen[str], int]:
    work.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", OWNER, mode, str(work)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def running_job(host_pid: int) -> int:
    jobs = wait_for(lambda: jobs_of(host_pid), 30)
    assert jobs, "the owner's job did not start"
    return int(jobs[0])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_host_and_job_die_with_their_owner(sig: int, tmp_path: Path) -> None:
    owner, host_pid = start_owner("run", tmp_path / "w")
    job = running_job(host_pid)
    owner.send_signal(sig)
    owner.wait(timeout=30)
    assert wait_for(lambda: not alive(host_pid) and not alive(job), 5), "a host or job outlived its owner"


def test_hosts_stop_when_their_owner_exits(tmp_path: Path) -> None:
    owner, host_pid = start_owner("exit", tmp_path / "w")
    ahead = standbys(host_pid)
    assert owner.wait(timeout=30) == 0
    assert wait_for(lambda: not alive(host_pid) and not any(alive(p) for p in ahead), 5), \
        "the host or its standby outlived its owner's exit"


# ---- the standby: the next job's process, forked ahead (workers.childproc) ----


def test_the_next_job_runs_in_the_standby_forked_ahead(pool: HostPool, tmp_path: Path) -> None:
    pool.warm(1)
    (host_pid,) = pool.idle_pids()
    (ahead,) = wait_for(lambda: standbys(host_pid), 10)
    result = run(pool, tmp_path, "a", action="ok")
    assert result["pid"] == ahead and result["ppid"] == host_pid and result["preloaded_in"] == [host_pid]
    assert result["cwd"] == str(tmp_path / "a") and result["comm"] == "ctxfarm-compile"
    (after,) = wait_for(lambda: standbys(host_pid), 10)  # the job after this one's
    assert after != ahead


def test_a_standby_killed_from_outside_is_replaced_by_a_fork(pool: HostPool, tmp_path: Path) -> None:
    pool.warm(1)
    (host_pid,) = pool.idle_pids()
    (ahead,) = wait_for(lambda: standbys(host_pid), 10)
    os.kill(ahead, signal.SIGKILL)
    assert wait_for(lambda: not alive(ahead), 5)
    result = run(pool, tmp_path, "a", action="ok")
    assert result["pid"] != ahead and result["ppid"] == host_pid
    with pytest.raises(WorkerLostError):  # and the job after it is a standby's again, crash isolated as ever
        run(pool, tmp_path, "b", action="segv")
    assert pool.idle_pids() == [host_pid] and pool.started == 1


def test_farm_prefault_mb_0_forks_each_job_when_it_comes(tmp_path: Path) -> None:
    pool = HostPool(FAKE, env={"FARM_PREFAULT_MB": "0"})
    try:
        pool.warm(1)
        (host_pid,) = pool.idle_pids()
        assert run(pool, tmp_path, "a", action="ok")["ppid"] == host_pid
        assert standbys(host_pid) == []
    finally:
        pool.close()


def test_prestarted_hosts_serve_the_first_jobs(tmp_path: Path) -> None:
    """``prestart`` spawns without waiting; the first jobs take those hosts (no start of their
    own), and a host no job took is killed with the pool."""
    pool = HostPool(FAKE, slots=1)
    try:
        pool.prestart(2)
        pool.prestart(2)  # already starting: nothing more
        starting = [h.pid for h in pool._starting]
        assert len(starting) == 2 and pool.started == 0
        result = run(pool, tmp_path, "a", action="ok")
        assert result["ppid"] == starting[0] and pool.started == 1
        assert result["preloaded_in"] == [starting[0]]
    finally:
        pool.close()
    assert wait_for(lambda: not alive(starting[1]), 5)


def test_prestart_spawns_one_host_for_the_jobs_its_slots_hold(tmp_path: Path) -> None:
    pool = HostPool(FAKE, slots=2)
    try:
        pool.prestart(2)
        assert len(pool._starting) == 1
        pool.prestart(3)  # a second host for the third job
        assert len(pool._starting) == 2
    finally:
        pool.close()


def test_a_prestarted_host_that_cannot_start_says_why_at_the_first_job(tmp_path: Path) -> None:
    pool = HostPool(FAKE, env={"FAKE_CHILD_PRELOAD_FAILS": "1"})
    try:
        pool.prestart(1)
        with pytest.raises(ToolchainError, match="no SDK in this environment"):
            run(pool, tmp_path, "a", action="ok")
    finally:
        pool.close()
