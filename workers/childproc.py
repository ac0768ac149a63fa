"""The inside of every compile/load child (``python -m workers.<backend>.child``).

Before any SDK is imported the child ties itself to its owner and caps itself:

- ``PR_SET_PDEATHSIG`` = SIGKILL, then a check that the parent is still the one that started us
  (closing the race where it died before the prctl): a SIGKILLed worker or ``farm build`` never
  leaves a compile running under init;
- ``RLIMIT_AS`` from ``CTXFARM_MEMORY_MB`` (address space; measured compile peaks are in
  farm.core.settings), so a model that asks for a huge tensor fails fast as ``resource-limit``;
- a watchdog thread that writes a ``resource-limit`` result and exits at ``CTXFARM_TIME_LIMIT``
  seconds, so the limit holds even if the parent cannot enforce it.

Results go to RESULT.json as ``{"ok": true, ...}`` or ``{"ok": false, "error": {...}}``.
The same guards hold for a job forked by a warm compile host (``serve_host``, below).
Imports nothing heavy at module level.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1

# Error texts of the EP/ORT mapped to our failure codes (first match wins).
_CLASSIFY = (
    ("bad_alloc", "resource-limit"),
    ("bad allocation", "resource-limit"),
    ("Failed to allocate memory", "resource-limit"),
    ("MemoryError", "resource-limit"),
    ("Cannot allocate memory", "resource-limit"),
    ("QNN_COMMON_ERROR_MEM_ALLOC", "resource-limit"),  # the HTP compiler's own refused allocation
    ("soc_model is not specified", "bad-options"),
    ("QNN_DEVICE_ERROR_INVALID_CONFIG", "bad-options"),
    ("INVALID_PROTOBUF", "invalid-model"),
    ("Protobuf parsing failed", "invalid-model"),
    ("Unsupported model IR version", "invalid-model"),
    ("NOT_IMPLEMENTED", "unsupported-ops"),
    ("Could not find an implementation", "unsupported-ops"),
)

_RESULT_PATH: list[str] = []
_LOCK = threading.Lock()


def classify(message: str) -> str:
    for needle, code in _CLASSIFY:
        if needle in message:
            return code
    return "toolchain-error"


def write_result(data: dict[str, Any]) -> None:
    if not _RESULT_PATH:
        return
    with _LOCK:
        tmp = _RESULT_PATH[0] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, _RESULT_PATH[0])


def checkpoint(data: dict[str, Any]) -> None:
    """Write what is known so far: if a later step crashes the process (SDK segfaults are real:
    light_inception_v1 built for SM8650 kills the x86_64 HTP simulator when run), the parent
    still gets the finished steps."""
    write_result({"ok": True, "partial": True, **data})


def install_guards(env: dict[str, str] | None = None) -> None:
    """Die with the parent, cap memory, enforce the time limit (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    parent = int(env.get("CTXFARM_PARENT_PID", "0") or 0)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent and os.getppid() != parent:
        os._exit(137)  # the parent died before the prctl took effect
    memory_mb = int(env.get("CTXFARM_MEMORY_MB", "0") or 0)
    if memory_mb > 0:
        import resource

        cap = memory_mb * 1024 * 1024
        mapped = _mapped_bytes()
        if cap < mapped + _CAP_HEADROOM:
            # Below what this process already maps, every allocation fails, and a forked job
            # measured hanging on a lock instead of failing: refuse at once, with the figures.
            write_result({"ok": False, "error": {
                "code": "resource-limit",
                "message": f"the memory cap of {memory_mb} MiB (FARM_COMPILE_MEMORY_MB) is below what the compile "
                           f"process maps before compiling ({mapped >> 20} MiB + {_CAP_HEADROOM >> 20} MiB headroom)"}})
            os._exit(1)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    limit = float(env.get("CTXFARM_TIME_LIMIT", "0") or 0)
    if limit > 0:
        def watchdog() -> None:
            write_result({"ok": False, "error": {
                "code": "resource-limit",
                "message": f"the compile child ran past its time limit of {limit:g} s and stopped itself"}})
            os._exit(124)

        timer = threading.Timer(limit, watchdog)
        timer.daemon = True
        timer.start()


_CAP_HEADROOM = 64 << 20


def _mapped_bytes(field: str = "VmSize") -> int:
    """This process's address space now (VmSize; or another /proc/self/status figure in kB, as
    VmRSS), 0 where /proc can't tell."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


Commands = dict[str, Callable[[dict[str, Any]], dict[str, Any]]]


def run_commands(argv: list[str], commands: Commands, *, preload: Callable[[], None] | None = None) -> int:
    """``child COMMAND REQUEST.json RESULT.json``, or ``child host`` (a warm compile host: see
    ``serve_host``); shared by every backend's child."""
    if argv[1] == "host":
        return serve_host(commands, preload)
    return run_one(argv[1], argv[2], argv[3], commands)


def run_one(command: str, req_path: str, res_path: str, commands: Commands,
            env: dict[str, str] | None = None) -> int:
    """Guard this process, run one command, write its result; returns the exit code."""
    _RESULT_PATH[:] = [res_path]
    install_guards(env)
    try:
        with open(req_path) as f:
            req = json.load(f)
        out: dict[str, Any] = {"ok": True, **commands[command](req)}
        rc = 0
    except MemoryError:
        out = {"ok": False, "error": {"code": "resource-limit",
                                      "message": "the compile ran out of memory under its cap (MemoryError)"}}
        rc = 1
    except Exception as exc:  # the parent maps the code; the log has the traceback
        import traceback

        traceback.print_exc()
        from farm.core.errors import FarmError

        if isinstance(exc, FarmError):  # a child's own verdict keeps its code and hint
            out = {"ok": False, "error": {k: v for k, v in exc.to_dict().items() if k != "details"}}
        else:
            message = str(exc).strip() or type(exc).__name__
            out = {"ok": False, "error": {"code": classify(message), "message": message[:4000]}}
        rc = 1
    write_result(out)
    return rc


# ---- the warm compile host ------------------------------------------------------------------------
#
# ``python -m workers.<backend>.child host`` imports the SDK once (``preload``: onnxruntime, the EP
# library registered) and then forks one job process per request. Fork, not a reused process:
# the same compile in a process that already compiled writes different context bytes (measured,
# QNN 2.51.0), while a fork of a host that only imported and registered writes the bytes a fresh
# process writes. And fork, not threads: a job may segfault, leak or be killed. The host stays
# single-threaded apart from what the imports start (onnxruntime: one idle telemetry dispatcher;
# numpy's BLAS pool is kept off with OPENBLAS_NUM_THREADS=1), and it never creates a session.
#
# Protocol, one JSON object a line. Requests on stdin: {"op": "run", "id", "command", "request",
# "result", "log", "cwd", "timeout", "memory_mb"} and {"op": "kill", "id"}; EOF = the owner is
# gone: kill every job, exit. Jobs of different ids run at once (a `farm build` for two SoCs
# compiles both in forks of one host: onnxruntime imported once per call, not once per target);
# the owner bounds how many (workers.host.HostPool). Events on the stdout it was started with (fd 1 is then pointed at
# stderr, so a library printing to stdout cannot corrupt the protocol): {"event": "ready"} or
# {"event": "failed", "error"} once, then {"event": "started", "id", "pid"} and
# {"event": "exited", "id", "pid", "status" (a wait status), "maxrss_kib"} per job.

PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """/proc/PID/comm (15 bytes): a forked job keeps its host's command line, this names it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def serve_host(commands: Commands, preload: Callable[[], None] | None) -> int:
    import select
    import time
    import traceback
    import warnings

    proto = os.dup(1)
    os.dup2(2, 1)
    os.set_inheritable(proto, False)

    def send(event: dict[str, Any]) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:
            data = data[os.write(proto, data):]

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides; Ctrl-C reaches it, not us
    install_guards({"CTXFARM_PARENT_PID": os.environ.get("CTXFARM_PARENT_PID", "")})
    t0 = time.perf_counter()
    try:
        if preload is not None:
            preload()
    except BaseException as exc:
        send({"event": "failed", "error": (str(exc).strip() or type(exc).__name__)[:4000],
              "traceback": traceback.format_exc()[-8000:]})
        return 1
    threads = len(os.listdir(f"/proc/{os.getpid()}/task")) if os.path.isdir("/proc/self/task") else 0
    send({"event": "ready", "pid": os.getpid(), "threads": threads, "preload_seconds": time.perf_counter() - t0})
    # Python 3.12+ warns about fork with threads: the one left is the idle telemetry dispatcher
    # (see above), and the job never needs it.
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")

    # A job: id, pid, pidfd, and "done": the read end of a pipe the job writes its exit code to
    # once its result is written, just before os._exit. The owner is told then ("done"), not
    # after the exit: tearing down a process's memory takes ~60 ms per GiB (measured), and the
    # job's output is complete before it. The job is reaped when it is gone.
    jobs: dict[int, dict[str, Any]] = {}  # by the owner's id: running, or said done and exiting
    standby: dict[str, Any] | None = None  # the same, plus "wfd": the next job's process, forked ahead
    prefault_cap = prefault_limit_mb()
    host_mb = _mapped_bytes("VmRSS") >> 20  # a job's peak RSS counts the pages it shares with the host
    learned: dict[str, Any] = {"mb": min(prefault_cap, PREFAULT_FIRST_MB), "cap": 0, "recent": []}
    buf = b""
    me = os.getpid()

    def kill(j: dict[str, Any]) -> None:
        for fn in (os.killpg, os.kill):  # the group (the SDK may fork helpers), else the job alone
            try:
                fn(j["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def reap(j: dict[str, Any], *, report: bool = True) -> None:
        try:  # anything the job left in its group goes with it; its pid is not free until the wait
            os.killpg(j["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status, usage = os.wait4(j["pid"], 0)
        for fd in (j.get("pidfd"), j.get("done"), j.get("wfd")):
            if fd is not None:
                os.close(fd)
        if report:
            send({"event": "exited", "id": j["id"], "pid": j["pid"], "status": status,
                  "maxrss_kib": usage.ru_maxrss})
            # The next standby's heap: the most that one of the last jobs used beyond the host's own
            # (a release repeats each model per target; the job before may have been a small one).
            learned["recent"] = [*learned["recent"][-(PREFAULT_HISTORY - 1):], usage.ru_maxrss >> 10]
            learned["mb"] = _prefault_mb(max(learned["recent"]), host_mb, prefault_cap, learned["cap"])

    def fork_job(msg: dict[str, Any] | None) -> dict[str, Any] | None:
        """Fork a job for ``msg``, or a standby (``msg`` None) that waits for one; None if the
        fork failed."""
        done_r, done_w = os.pipe()
        handover = os.pipe() if msg is None else None
        try:
            pid = os.fork()
        except OSError:
            for fd in (done_r, done_w, *(handover or ())):
                os.close(fd)
            return None
        if pid == 0:
            os.close(done_r)
            if handover is None:
                assert msg is not None
                _job(msg, commands, proto, me, done_w)  # never returns
            os.close(handover[1])
            _standby(handover[0], learned["mb"], commands, proto, me, done_w)  # never returns
        os.close(done_w)
        j = {"pid": pid, "pidfd": os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None, "done": done_r}
        if handover is not None:
            os.close(handover[0])
            j["wfd"] = handover[1]
        return j

    def exited(j: dict[str, Any] | None, ready: list[int]) -> bool:
        if j is None:
            return False
        if j["pidfd"] is not None:
            return j["pidfd"] in ready
        return bool(os.waitid(os.P_PID, j["pid"], os.WEXITED | os.WNOHANG | os.WNOWAIT))

    def heard(j: dict[str, Any]) -> None:
        """Lines on a job's done pipe: "a" (a standby took the job) and then its exit code."""
        try:
            data = os.read(j["done"], 64)
        except OSError:
            data = b""
        if not data:  # closed by its exit: the exit says how it ended
            os.close(j["done"])
            j["done"] = None
            return
        j["said"] = j.get("said", b"") + data
        while b"\n" in j["said"]:
            said, j["said"] = j["said"].split(b"\n", 1)
            if said == b"a":
                j["accepted"] = True
            elif said.isdigit() and "id" in j:
                j["finished"] = True
                send({"event": "done", "id": j["id"], "pid": j["pid"], "rc": int(said)})

    standby = fork_job(None) if prefault_cap > 0 else None
    while True:
        live = [*jobs.values(), *([standby] if standby is not None else [])]
        # The running jobs' done pipes; a standby writes none until it is a job.
        watch = [0] + [j["pidfd"] for j in live if j["pidfd"] is not None] + [
            j["done"] for j in jobs.values() if j["done"] is not None]
        polling = any(j["pidfd"] is None for j in live)
        ready, _, _ = select.select(watch, [], [], 0.01 if polling else None)
        for jid, j in list(jobs.items()):
            if j["done"] is not None and j["done"] in ready:
                heard(j)
            if not exited(j, ready):
                continue
            if j.get("handed") is not None and not j.get("accepted") and not j.get("killed"):
                # A standby that died before it took the job (killed from outside, out of memory; a
                # dying process keeps its pipes open until its last thread is gone): run it afresh.
                # One the owner had killed is reaped as the job it became.
                line = j["handed"]
                reap(j, report=False)
                fresh = fork_job(json.loads(line))
                if fresh is None:
                    del jobs[jid]
                    send({"event": "error", "id": jid, "error": "fork failed"})
                else:
                    fresh["id"] = jid
                    jobs[jid] = fresh
                    send({"event": "started", "id": jid, "pid": fresh["pid"]})
            else:
                reap(j)
                del jobs[jid]
        if exited(standby, ready):  # killed from outside, or out of memory: fork the job when it comes
            assert standby is not None
            reap(standby, report=False)
            standby = None
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the owner is gone (or closed us): nothing may outlive it
            for left in (*jobs.values(), standby):
                if left is not None:
                    kill(left)
                    reap(left, report=left is not standby)
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            if msg["op"] == "kill":
                if msg["id"] in jobs:
                    jobs[msg["id"]]["killed"] = True
                    kill(jobs[msg["id"]])
            elif msg["op"] == "run":
                # Several jobs may run at once (the owner bounds how many): each is a fork of this
                # process, which only imported, so none sees another's state.
                if msg["id"] in jobs:
                    send({"event": "error", "id": msg["id"], "error": "a job with this id is already running"})
                    continue
                learned["cap"] = int(msg.get("memory_mb") or 0)
                if standby is not None and _hand_over(standby["wfd"], line):
                    job, standby = standby, None
                    os.close(job.pop("wfd"))
                    job["handed"] = line  # until it says it took it
                else:
                    if standby is not None:  # it died before it could take the job
                        kill(standby)
                        reap(standby, report=False)
                        standby = None
                    forked = fork_job(msg)
                    if forked is None:  # EAGAIN/ENOMEM: the owner reports it and replaces this host
                        send({"event": "error", "id": msg["id"], "error": "fork failed"})
                        continue
                    job = forked
                job["id"] = msg["id"]
                jobs[msg["id"]] = job
                send({"event": "started", "id": msg["id"], "pid": job["pid"]})
                if prefault_cap > 0:
                    standby = fork_job(None)  # warms up on a spare core while this job runs


# ---- the standby job ------------------------------------------------------------------------------
#
# A forked job starts with no heap of its own: each page the compile writes is a fresh page fault
# (measured, QNN 2.51.0 SM8750: light_resnet50 80k minor faults and ~130 ms of a ~1 s compile;
# light_squeezenet 13k, ~25 ms). A loop compiling in one process reuses the heap of the compile
# before, and writes other bytes for it. So the host forks the next job's process ahead of time
# (the "standby"): it raises glibc's mmap and trim thresholds, takes a heap of about what the last
# job used, and writes it in a thread at SCHED_IDLE (only CPU time nothing else wants: on a busy
# machine it does nothing), while the current job runs. The job, handed to it over a pipe, frees
# that heap first, and its allocations come from pages already there (measured: resnet50 8k
# faults, ~915 vs ~1030 ms; the bytes are those of a fresh process, as the tests check).
# ``FARM_PREFAULT_MB`` caps the heap (0: no standby, each job forked when it comes).

PREFAULT_DEFAULT_MB = 1024
PREFAULT_FIRST_MB = 256  # before any job has said what it uses
PREFAULT_HISTORY = 8  # jobs the heap size is learned from
_CHUNK = 8 << 20  # below M_MMAP_THRESHOLD: the chunks come from (and return to) the main heap
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_MADV_POPULATE_WRITE = 23  # Linux 5.14+ (not in Python 3.11's mmap module)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# Pages written ahead are pages torn down later at normal priority, and untouched excess is pure
# cost: on a box whose CPUs are all taken (a worker per core) the standby measured a loss (2
# workers on 2 cores: 0.90-0.96 x the loop with it, 0.82-0.84 without; 1 worker: 1.18-1.21 with,
# 1.27-1.32 without). So it writes only while the CPU pressure (PSI: the share of the last 10 s in
# which some task waited for a CPU) stays below this.
PREFAULT_MAX_PRESSURE = 25.0


def cpu_pressure() -> float:
    """/proc/pressure/cpu "some avg10" (percent); 0 where the kernel has no PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return 0.0


def prefault_limit_mb(env: dict[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get("FARM_PREFAULT_MB", "")
    try:
        return max(0, int(raw)) if raw.strip() else PREFAULT_DEFAULT_MB
    except ValueError:
        return PREFAULT_DEFAULT_MB  # the CLI and the worker refuse a bad value (farm.core.settings)


def _prefault_mb(job_peak_mb: int, host_mb: int, limit_mb: int, cap_mb: int) -> int:
    """The next standby's heap: the last job's peak beyond the host's size, within FARM_PREFAULT_MB
    and leaving the job's memory cap a margin."""
    mb = -(-max(0, job_peak_mb - host_mb) // 8) * 8  # whole 8 MiB blocks, up
    if cap_mb > 0:
        mb = min(mb, max(0, cap_mb - host_mb - 512) // 8 * 8)
    return min(limit_mb, mb)


class _Prefault:
    """A heap of ``mb`` MiB taken now (address space only) and written by a SCHED_IDLE thread."""

    def __init__(self, mb: int) -> None:
        import ctypes

        self.libc = libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.memset = ctypes.memset
        # Keep what the job frees (no trim) and take blocks up to 32 MiB from the heap, not mmap.
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
        libc.mallopt(_M_ARENA_MAX, 1)  # the SDK's threads allocate from this heap too
        self.blocks = [p for p in (libc.malloc(_CHUNK) for _ in range(mb * (1 << 20) // _CHUNK)) if p]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._touch, name="prefault", daemon=True)
        self.thread.start()

    def _touch(self) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
        except (OSError, AttributeError):
            return  # no idle class here: no work that would compete with the compile
        populate = True
        for p in self.blocks:
            if self.stopping.is_set() or cpu_pressure() > PREFAULT_MAX_PRESSURE:
                return
            if populate:
                # The kernel faults the block's whole pages in (zeroed, as a write fault would):
                # one pass over the memory where a memset after each fault made two (measured:
                # 368 MiB in 95 ms of CPU against 167 ms). The edges' partial pages are written.
                start, end = -(-p // _PAGE) * _PAGE, (p + _CHUNK) // _PAGE * _PAGE
                populate = self.libc.madvise(start, end - start, _MADV_POPULATE_WRITE) == 0
                if populate:
                    self.memset(p, 0, start - p)
                    self.memset(end, 0, p + _CHUNK - end)
                    continue
            self.memset(p, 0, _CHUNK)  # a kernel before 5.14 (EINVAL): written by hand

    def release(self) -> None:
        self.stopping.set()
        self.thread.join()
        for p in self.blocks:
            self.libc.free(p)
        self.blocks = []


def _hand_over(wfd: int, line: bytes) -> bool:
    try:
        os.write(wfd, line + b"\n")  # < PIPE_BUF: one write, never partial
        return True
    except OSError:  # EPIPE: the standby is gone
        return False


def _standby(rfd: int, mb: int, commands: Commands, proto: int, host: int, done: int) -> NoReturn:
    """A job process forked ahead: warms its heap until the job arrives on ``rfd`` (EOF: the host
    closed it or died: exit), then runs it as ``_job``. Exits with os._exit."""
    try:
        os.setsid()
        os.close(proto)
        set_process_name("ctxfarm-standby")
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != host:
            os._exit(137)
        warm = _Prefault(mb) if mb > 0 else None
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(rfd, 65536)
            if not chunk:
                os._exit(0)
            data += chunk
        os.close(rfd)
        os.write(done, b"a\n")  # taken: from here on the host reports this process's end as the job's
        msg = json.loads(data)
        if warm is not None:
            warm.release()
            cap = int(msg.get("memory_mb") or 0) << 20
            if cap and _mapped_bytes() + _CAP_HEADROOM > cap:
                warm.libc.malloc_trim(0)  # a cap this tight: the freed heap goes back, as if never taken
    except BaseException:
        os._exit(70)
    _job(msg, commands, None, host, done)


def _job(msg: dict[str, Any], commands: Commands, proto: int | None, host: int, done: int) -> NoReturn:
    """The forked job: its own session (its group is killed as one), tied to the host by
    PDEATHSIG (``install_guards``; the host is tied to its owner the same way), in the job's
    work dir, output to the job's log, capped in memory and time. Exits with os._exit."""
    rc = 70
    try:
        if proto is not None:  # forked for this job (a standby did both already)
            os.setsid()
            os.close(proto)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        set_process_name(f"ctxfarm-{msg['command']}")
        fd = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(msg["cwd"])
        rc = run_one(msg["command"], msg["request"], msg["result"], commands, env={
            "CTXFARM_PARENT_PID": str(host), "CTXFARM_MEMORY_MB": str(int(msg.get("memory_mb") or 0)),
            "CTXFARM_TIME_LIMIT": f"{float(msg.get('timeout') or 0):g}"})
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        try:
            os.write(done, b"%d\n" % rc)  # the result is written: the host tells the owner now
        except OSError:
            pass
        os._exit(rc)
