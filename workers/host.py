"""Warm compile hosts: the SDK imported once per process, a fresh fork per compile.

A compile used to start ``python -m workers.<backend>.child compile ...``: an interpreter, the
onnxruntime import and the EP registration, about 0.3 s of CPU before the EP's own work. A host
(``python -m workers.<backend>.child host``, ``workers.childproc.serve_host``) pays that once and
then forks one job process per compile:

- the job is a fresh copy of a process that only imported and registered, so it writes the bytes
  a fresh process writes (a process reused for a second compile does not: measured, QNN 2.51.0),
  and a segfault, a leak or a kill ends the job, never the host or the caller;
- the job has the guards of a compile child: its own session (its group is killed as one),
  ``PR_SET_PDEATHSIG`` to the host (and the host to its owner: a SIGKILLed worker takes both
  down), ``RLIMIT_AS`` from the job's memory cap, a watchdog at its time limit;
- the owner waits on the host's pipe (woken when the job exits), looks at the cancel flag before
  it asks for the job (set: nothing starts), as the job starts and every ``CANCEL_POLL`` s and, on
  a lost lease, a timeout or any exception (SIGTERM), has the host kill
  the job's group and waits for the host to say it is gone; a host that does not answer is
  killed, and its job with it.

``HostPool`` keeps the hosts of this process's concurrent compiles (``pool_for``), several jobs
at once in one host (``slots``, default the CPUs: the SDK imported once, not per job); a host is
replaced after ``HOST_MAX_JOBS`` jobs, and at once when it misbehaves or dies. Hosts stop when
the process exits (``shutdown``, atexit: stdin closed, the host exits). TensorRT does not use
hosts: CUDA does not survive a fork. This module imports no onnxruntime.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from farm.core.errors import LeaseLostError, ResourceLimitError, ToolchainError, WorkerLostError
from workers.runner import KILL_GRACE_S, CancelFlag, child_outcome, read_log

HOST_MAX_JOBS = 200  # the host runs no compile itself: a bound on anything unforeseen, cheap to pay
START_TIMEOUT = 120.0  # seconds for a host to import the SDK and say it is ready
STOP_TIMEOUT = 2.0  # seconds for a host to confirm a killed job is gone before the host goes too
CANCEL_POLL = 0.05  # a lost lease stops the job within this (plus the kill)


class _HostGone(Exception):
    pass


class CompileHost:
    """One warm host process and the jobs it runs, each forked from it. Several threads may run
    jobs at once (a pool bounds how many, ``HostPool.slots``): the events on the host's pipe are
    read by one of them at a time and handed to the job they name."""

    def __init__(self, module: str, *, python: str | None = None, env: dict[str, str] | None = None):
        self.module = module
        self.jobs = 0
        self.broken = False
        self.info: dict[str, Any] = {}
        self.job_pid: int | None = None  # the last started job's, while it runs
        self.active = 0  # jobs running now (the pool's count, under its lock)
        self.counted = False  # in its pool's ``started``
        self._ready_lock = threading.Lock()
        self._buf = b""
        self._seq = 0
        self._cv = threading.Condition()  # guards _seq, _mail, _reading, _gone and the pipe's writes
        self._mail: dict[int, list[dict[str, Any]]] = {}  # events read for each running job
        self._reading = False  # one thread reads the pipe at a time
        self._gone = False  # the pipe hit EOF: every job's caller hears it
        full_env = {**os.environ, **(env or {})}
        root = str(Path(__file__).resolve().parent.parent)  # the host imports this project from anywhere
        full_env["PYTHONPATH"] = root + (os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
        full_env["CTXFARM_PARENT_PID"] = str(os.getpid())
        # numpy's BLAS would start a thread pool at import: the host forks, so it starts none.
        full_env.setdefault("OPENBLAS_NUM_THREADS", "1")
        argv = [python or sys.executable, "-m", module, "host"]
        self.proc: subprocess.Popen[bytes] = _spawn(lambda: subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env=full_env,
            start_new_session=True))  # own session: Ctrl-C in a terminal reaches the owner, which decides

    @classmethod
    def start(cls, module: str, *, python: str | None = None, env: dict[str, str] | None = None) -> CompileHost:
        host = cls(module, python=python, env=env)
        host.wait_ready()
        return host

    def ensure_ready(self) -> bool:
        """Ready (waited for by the first of its callers), or False when it could not start."""
        with self._ready_lock:
            if self.info:
                return True
            if self.broken:
                return False
            try:
                self.wait_ready()
            except ToolchainError:
                return False
            return True

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        try:
            msg = self._read(time.monotonic() + timeout)
        except _HostGone:
            msg = None
        except BaseException:  # Ctrl-C, SIGTERM while it starts: it must not be left behind
            self.close(kill=True)
            raise
        if msg is None or msg.get("event") != "ready":
            self.close(kill=True)
            why = (msg or {}).get("error") or (f"it exited with code {self.proc.returncode}" if msg is None
                                               else f"it said {msg!r}")
            raise ToolchainError(f"the compile host ({self.module}) did not start: {why}",
                                 details={"log": str((msg or {}).get("traceback", ""))})
        self.info = msg

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def run(self, command: str, request: dict[str, Any], work_dir: Path, *, timeout: float, memory_mb: int = 0,
            cancel: CancelFlag | None = None) -> tuple[dict[str, Any], float, str, dict[str, float]]:
        """Run one command in a forked job; the contract of ``workers.runner.run_child``
        (result, wall seconds, log; the same FarmErrors), plus timings of the call."""
        if cancel is not None and cancel.is_set():  # lost before it began: start nothing
            raise LeaseLostError(f"{command} not started: this executor lost the build's lease")
        req_path = work_dir / f"{command}-request.json"
        res_path = work_dir / f"{command}-result.json"
        log_path = work_dir / f"{command}.log"
        req_path.write_text(json.dumps(request))
        res_path.unlink(missing_ok=True)
        with self._cv:
            self._seq += 1
            jid = self._seq
            self._mail[jid] = []
        start = time.perf_counter()
        deadline = time.monotonic() + timeout + KILL_GRACE_S
        started = start
        status: int | None = None
        peak_kib = 0
        stopped: str | None = None  # "cancel" | "timeout": the job was killed, and why
        started_pid: list[int | None] = [None]
        try:
            self._send({"op": "run", "id": jid, "command": command, "request": str(req_path),
                        "result": str(res_path), "log": str(log_path), "cwd": str(work_dir), "timeout": timeout,
                        "memory_mb": int(memory_mb)})
            while status is None:
                msg = self._next(jid, time.monotonic() + CANCEL_POLL)
                if msg is None or msg.get("event") == "started":
                    # The flag is read every CANCEL_POLL and as the job starts: a job shorter
                    # than one poll is stopped too when the lease went while it was forked.
                    if msg is not None:
                        self.job_pid, started = int(msg["pid"]), time.perf_counter()
                        started_pid[0] = self.job_pid
                    if cancel is not None and cancel.is_set():
                        stopped = "cancel"
                    elif time.monotonic() > deadline:
                        stopped = "timeout"
                    if stopped:
                        self._stop(jid)
                        break
                    continue
                if msg.get("event") == "exited":
                    status, peak_kib = int(msg["status"]), int(msg.get("maxrss_kib") or 0)
                elif msg.get("event") == "done":
                    # The job wrote its result and is exiting: a success needs nothing of its exit
                    # (the host reaps it before the next job); a failure waits for the exit status.
                    if int(msg.get("rc", -1)) == 0:
                        status = 0
                else:
                    self.broken = True
                    raise ToolchainError(f"the compile host refused the job: {msg.get('error', msg)}")
        except _HostGone:
            self.broken = True
            # The job went with it: PDEATHSIG, or its own check of its parent right after the prctl.
            how = _how_it_ended(self.close(kill=True))
            exc = WorkerLostError(f"{command}: the compile host died ({how}) and its job with it",
                                  hint="the host is replaced for the next build; the log holds the job's last words")
            exc.details["log"] = read_log(log_path)
            raise exc from None
        except BaseException:  # Ctrl-C, SIGTERM (Interrupted), a bug: the job must not outlive this
            self._stop(jid)
            raise
        finally:
            with self._cv:
                self._mail.pop(jid, None)
            if self.job_pid == started_pid[0]:
                self.job_pid = None
        if stopped == "cancel":
            raise LeaseLostError(f"{command} stopped: this executor lost the build's lease")
        if stopped == "timeout" or status is None:
            raise ResourceLimitError(f"{command} did not finish within {timeout:g} s and was stopped",
                                     details={"log": read_log(log_path)})
        wall = time.perf_counter() - start
        with self._cv:
            self.jobs += 1
        result, log_text = child_outcome(command, os.waitstatus_to_exitcode(status), peak_kib, res_path, log_path,
                                         memory_mb)
        return result, wall, log_text, {"fork_seconds": started - start, "job_seconds": time.perf_counter() - started}

    def close(self, *, kill: bool = False, wait: bool = True) -> int | None:
        """Stop the host: stdin closed (it kills a running job and exits), or SIGKILL when
        ``kill`` or when it does not exit in time. Returns its exit code. ``wait=False`` (this
        process is exiting): stdin closed and on; the host exits at EOF, and PR_SET_PDEATHSIG
        takes it down with this process anyway."""
        if not wait and not kill and self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
            except OSError:
                pass
            self.broken = True
            return None
        if self.proc.poll() is None and not kill:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its jobs have their own sessions: PDEATHSIG
            except ProcessLookupError:
                pass
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass
        self.broken = True
        return self.proc.returncode

    def forget(self) -> None:
        """After a fork, in the child: let go of the parent's host without touching it."""
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    os.close(f.fileno())
            except OSError:
                pass
        self.broken = True

    # -- the pipe --------------------------------------------------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            with self._cv:
                self.proc.stdin.write((json.dumps(msg) + "\n").encode())
                self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            raise _HostGone() from None

    def _next(self, jid: int, deadline: float) -> dict[str, Any] | None:
        """Job ``jid``'s next event, or None at ``deadline``; _HostGone at EOF. The thread that
        reads the pipe keeps the events of other jobs for their callers; an event of a job no
        caller waits for any more (killed, its caller gone) is dropped."""
        while True:
            with self._cv:
                while True:
                    box = self._mail.get(jid)
                    if box:
                        return box.pop(0)
                    if self._gone:
                        raise _HostGone()
                    if not self._reading:
                        self._reading = True
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._cv.wait(left)
            msg: dict[str, Any] | None = None
            try:
                msg = self._read(deadline)
            except _HostGone:
                with self._cv:
                    self._gone = True
                raise
            finally:
                with self._cv:
                    self._reading = False
                    if msg is not None and msg.get("id") in self._mail:
                        self._mail[msg["id"]].append(msg)
                    self._cv.notify_all()
            if msg is None:
                return None

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next event, or None at ``deadline``; _HostGone at EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _HostGone()
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg: dict[str, Any] = json.loads(line)
        except ValueError:
            raise _HostGone() from None
        return msg

    def _stop(self, jid: int) -> None:
        """Kill the job and wait until the host has reaped it; a host that does not answer in
        STOP_TIMEOUT s is killed (the job dies with it)."""
        if self.alive():
            try:
                self._send({"op": "kill", "id": jid})
                deadline = time.monotonic() + STOP_TIMEOUT
                while (msg := self._next(jid, deadline)) is not None:
                    if msg.get("event") == "exited":
                        with self._cv:
                            self.jobs += 1
                        return
            except _HostGone:
                pass
        self.close(kill=True)  # the job goes with it (PDEATHSIG)


def cpu_count() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class HostPool:
    """Warm hosts of one child module: ``run`` takes a host with a free slot (or starts one), so
    N callers in N threads compile in N jobs at once, up to ``slots`` jobs in one host. A second
    host would import the SDK again (onnxruntime: ~0.2 s of CPU, a fixed cost of every `farm build`
    for two SoCs, and on a busy machine CPU is wall time), while a job forked from a busy host is
    the same fork as from an idle one. The price: a host that dies takes its running jobs with it
    (each caller hears ``worker-lost``, as for a lost job). Default: one host for this process's
    CPUs (a Celery worker process runs one compile at a time either way)."""

    def __init__(self, module: str, *, python: str | None = None, env: dict[str, str] | None = None,
                 max_jobs: int = HOST_MAX_JOBS, slots: int | None = None):
        self.module, self.python, self.env, self.max_jobs = module, python, env, max_jobs
        self.slots = max(1, slots if slots is not None else cpu_count())
        self.started = 0  # hosts started over the pool's life (a test and the bench read it)
        self._idle: list[CompileHost] = []  # hosts with a free slot (maybe running jobs)
        self._starting: list[CompileHost] = []  # spawned by ``prestart``, not yet known to be ready
        self._lock = threading.Lock()
        self._closed = False

    def _new(self) -> CompileHost:
        host = CompileHost.start(self.module, python=self.python, env=self.env)
        host.counted = True
        with self._lock:
            self.started += 1
        return host

    def _take(self, host: CompileHost) -> None:
        """A slot of ``host`` for the caller (under the lock): it stays on offer while slots are free."""
        host.active += 1
        if host in self._idle:
            self._idle.remove(host)
        if host.active < self.slots and not self._closed:
            self._idle.append(host)

    @contextmanager
    def host(self) -> Iterator[CompileHost]:
        """A slot of a live host: an idle one's, else a starting one's (prestarted, or started now;
        the first of its callers waits for it to be ready, the others wait with it); a host that
        could not start is replaced by a fresh start, which says why it fails."""
        host: CompileHost | None = None
        starting: CompileHost | None = None
        with self._lock:
            if self._closed:
                raise ToolchainError("the compile hosts of this process were shut down")
            if self._idle:
                host = self._idle[-1]
                self._take(host)
            else:
                if not self._starting:
                    # Started here, not waited for under the lock: callers that come meanwhile share it.
                    self._starting.append(CompileHost(self.module, python=self.python, env=self.env))
                starting = self._starting[0]
                starting.active += 1
                if starting.active >= self.slots:
                    self._starting.remove(starting)
        if starting is not None:
            ready = starting.ensure_ready()  # closes it when it fails: a fresh start below says why
            with self._lock:
                if starting in self._starting:
                    self._starting.remove(starting)
                if ready:
                    host = starting
                    if not host.counted:
                        host.counted = True
                        self.started += 1
                    if host.active < self.slots and host not in self._idle and not self._closed:
                        self._idle.append(host)
                else:
                    starting.active -= 1
        if host is not None and not host.alive():
            self._release(host)
            host = None
        if host is None:
            host = self._new()
            with self._lock:
                self._take(host)
        try:
            yield host
        finally:
            self._release(host)

    def _release(self, host: CompileHost) -> None:
        """The caller's slot back; the host stays on offer, or is closed by its last caller when it
        is dead, at ``max_jobs`` or the pool is closed."""
        with self._lock:
            host.active -= 1
            keep = host.alive() and host.jobs < self.max_jobs and not self._closed
            if keep and host.active < self.slots and host not in self._idle:
                self._idle.append(host)
            elif not keep and host in self._idle:
                self._idle.remove(host)
            last = host.active == 0
        if not keep and last:
            host.close(kill=not host.alive())

    def run(self, command: str, request: dict[str, Any], work_dir: Path, *, timeout: float, memory_mb: int = 0,
            cancel: CancelFlag | None = None) -> tuple[dict[str, Any], float, str, dict[str, float]]:
        t0 = time.perf_counter()
        with self.host() as h:
            waited = time.perf_counter() - t0
            result, wall, log, timings = h.run(command, request, work_dir, timeout=timeout, memory_mb=memory_mb,
                                               cancel=cancel)
        return result, wall, log, {"host_wait_seconds": waited, **timings}

    def prestart(self, n: int = 1) -> None:
        """Spawn the hosts for ``n`` concurrent jobs now (``slots`` to a host) without waiting for
        them: their interpreter start and SDK import (0.2-0.4 s here) run beside the caller's own
        work (a `farm build`: its imports, the index, hashing the model) instead of after it; the
        first compiles take them."""
        with self._lock:
            missing = max(-(-n // self.slots) - len(self._idle) - len(self._starting), 0)
            if self._closed or not missing:
                return
        fresh = [CompileHost(self.module, python=self.python, env=self.env) for _ in range(missing)]
        with self._lock:
            self._starting.extend(fresh)

    def warm(self, n: int = 1) -> None:
        """Have hosts ready for ``n`` concurrent jobs (``slots`` to a host; started side by side)."""
        with self._lock:
            missing = max(-(-n // self.slots) - len(self._idle), 0)
        fresh = [CompileHost(self.module, python=self.python, env=self.env) for _ in range(missing)]
        try:
            for h in fresh:
                h.wait_ready()
        except BaseException:
            for h in fresh:
                h.close(kill=True)
            raise
        with self._lock:
            self.started += len(fresh)
            for h in fresh:
                h.counted = True
            self._idle.extend(fresh)

    def idle_pids(self) -> list[int]:
        with self._lock:
            return [h.pid for h in self._idle]

    def close(self, *, wait: bool = True) -> None:
        with self._lock:
            self._closed = True
            # A host running jobs is closed by the last of its callers (``_release``).
            idle = [h for h in self._idle if h.active == 0]
            self._idle = []
            starting, self._starting = self._starting, []
        for h in idle:
            h.close(wait=wait)
        for h in starting:
            h.close(kill=True)  # never taken: maybe still importing

    def forget(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            starting, self._starting = self._starting, []
        for h in idle + starting:
            h.forget()


# ---- one pool per child module per process ----------------------------------------------------

_POOLS: dict[tuple[int, str, str], HostPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(module: str, *, python: str | None = None) -> HostPool:
    """This process's pool of hosts for ``module`` (a forked process gets its own)."""
    key = (os.getpid(), module, python or sys.executable)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = HostPool(module, python=python)
        return pool


def shutdown(*, wait: bool = True) -> None:
    """Stop every host of this process (a worker's stop; atexit, without waiting)."""
    pid = os.getpid()
    with _POOLS_LOCK:
        pools = [p for k, p in _POOLS.items() if k[0] == pid]
        for k in [k for k in _POOLS if k[0] == pid]:
            del _POOLS[k]
    for p in pools:
        p.close(wait=wait)


def _shutdown_at_exit() -> None:
    # Waiting for each host to tear its SDK down cost every `farm build` call 0.3-0.4 s after
    # its last line; the hosts exit at EOF on their own (and by PDEATHSIG when we are gone).
    shutdown(wait=False)


def _after_fork_in_child() -> None:
    # A forked process (Celery's prefork pool) must not hold its parent's host pipes open: the
    # host would miss its owner's death (EOF) as long as the child lives.
    global _SPAWNER
    _SPAWNER = None
    for key, pool in list(_POOLS.items()):
        if key[0] != os.getpid():
            pool.forget()
            del _POOLS[key]


atexit.register(_shutdown_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- where hosts are started ------------------------------------------------------------------
# PR_SET_PDEATHSIG fires when the *thread* that started the process ends, not the process. A
# host started from a build thread would die with that thread; so hosts are started by the main
# thread or by one long-lived spawner thread, which end only with the process.

class _Spawner:
    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="compile-host-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, box, done = self.calls.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[[], Any]) -> Any:
        box: list[Any] = []
        done = threading.Event()
        self.calls.put((fn, box, done))
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value


_SPAWNER: _Spawner | None = None


def _spawn(fn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    global _SPAWNER
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _POOLS_LOCK:
        if _SPAWNER is None:
            _SPAWNER = _Spawner()
        spawner = _SPAWNER
    proc: subprocess.Popen[bytes] = spawner.call(fn)
    return proc


def _how_it_ended(rc: int | None) -> str:
    if rc is None:
        return "unknown"
    if rc < 0:
        try:
            return f"signal {-rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"
