"""Compile vs answer-from-the-index, in process and from the shell.

Builds a light model for two SoCs in a temp FARM_HOME (SQLite + local blob dir), and with
``--admin-url`` in a throwaway PostgreSQL database too (dropped at the end). Then:

- in process: the EP compile, the first build, a cached ``plan.build`` (the library's full
  path) and the CLI's fast path ``farm.pipeline.cached.answer``, p50 of ``--repeat``; then a
  live worker row for the toolchain, as a cluster's worker records it;
- from the shell: each command is a subprocess of the real ``farm`` console script (the one
  beside this interpreter; PYTHONPATH points it at this checkout, which is what the editable
  install points at anyway), end to end, timed from the parent: wall and CPU (user+sys) per run,
  median of ``--runs``, the commands interleaved run by run so a noisy neighbour hits them all
  alike. Interpreter start (``python -c pass``, the same interpreter) is measured in the same
  run: the "less start" column subtracts its median. ``python -m farm.cli`` is timed beside the
  console script. With ``--baseline-tree DIR`` (an older checkout, e.g. ``git archive``'d),
  the same commands run again on that code (PYTHONPATH=DIR) against the same indexes.

Children run with bytecode caching on (PYTHONDONTWRITEBYTECODE unset), as an installed package
runs; one untimed warm-up run per command writes the caches. Each run's output is checked (the
build answers ``cached`` for every target, resolve names the artifact). Prints a table and
writes JSON to bench/out/cache.json. Nothing is compared with a fixed time.

    python bench/cache.py [--model squeezenet] [--runs 21] [--repeat 20]
    python bench/cache.py --admin-url postgresql://postgres@127.0.0.1:5432/test --baseline-tree /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout, as the children get it

from farm.core.settings import Settings  # noqa: E402
from farm.pipeline.cached import answer  # noqa: E402
from farm.pipeline.plan import build  # noqa: E402
from registry.index import Registry  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402

TARGETS = ["qnn:SM8650", "qnn:SM8750"]


@dataclass
class Command:
    label: str
    argv: list[str]
    env: dict[str, str]
    expect: str = ""  # every run's stdout must hold this
    expect_count: int = 1
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def run(self, *, warm_up: bool = False) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(self.argv, env=self.env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if warm_up:
            return
        if proc.returncode != 0 or proc.stdout.count(self.expect) < self.expect_count:
            raise SystemExit(f"{self.label}: unexpected result (rc {proc.returncode}):\n{proc.stdout[-1500:]}\n"
                             f"{proc.stderr[-1500:]}")
        self.wall.append(wall)
        self.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


ROOT = Path(__file__).resolve().parent.parent


def child_env(extra: dict[str, str], tree: Path | None = None) -> dict[str, str]:
    """The environment of a timed command: the ctxfarm of ``tree`` (default: this checkout, what
    the editable install points at anyway) on PYTHONPATH, bytecode caching on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree or ROOT)
    return {**env, **extra}


def farm_commands(prefix: str, farm: list[str], env: dict[str, str], model: Path, resolve_version: str,
                  expect_resolved: str) -> tuple[Command, Command]:
    build_args = ["build", str(model), *sum((["-t", t] for t in TARGETS), []), "--name", "bench", "--tag", "stable"]
    resolve_args = ["resolve", "-m", "bench:stable", "--soc", "SM8650", "--qnn", resolve_version]
    return (Command(f"{prefix} cached `farm build` ({len(TARGETS)} targets)", farm + build_args, env, " cached ",
                    len(TARGETS)),
            Command(f"{prefix} `farm resolve`", farm + resolve_args, env, expect_resolved))


def setup_postgres(admin_url: str) -> tuple[str, str]:
    """A fresh database on the server of ``admin_url``: (its FARM_DATABASE_URL, its name)."""
    import psycopg

    name = f"ctxfarm_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    from registry.db import migrate

    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    migrate(url)  # PostgreSQL is never migrated implicitly: the operator's `farm db upgrade`
    return url, name


def drop_postgres(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--repeat", type=int, default=20, help="in-process cached builds")
    ap.add_argument("--runs", type=int, default=21, help="timed runs of each shell command")
    ap.add_argument("--admin-url", help="a PostgreSQL to also bench on (a throwaway database is made there), "
                                        "e.g. postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--baseline-tree", type=Path, help="an older checkout to time the same commands on")
    ap.add_argument("--baseline-runs", type=int, default=7)
    args = ap.parse_args()
    farm_script = Path(sys.executable).parent / "farm"
    if not farm_script.exists():
        raise SystemExit(f"no `farm` console script beside {sys.executable}: pip install -e . first")
    model = light(args.model)
    pg_names: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-") as tmp:

        def homes_for(kind: str) -> dict[str, dict[str, str]]:
            homes = {"SQLite": {"FARM_HOME": str(Path(tmp) / kind / "sqlite")}}
            if args.admin_url:
                pg_url, pg_name = setup_postgres(args.admin_url)
                pg_names.append(pg_name)
                homes["PostgreSQL"] = {"FARM_HOME": str(Path(tmp) / kind / "pg"), "FARM_DATABASE_URL": pg_url}
            return homes

        try:
            homes = homes_for("now")
            inproc, artifacts, toolchain = in_process(homes, model, args.repeat)
            commands = shell_commands(homes, model, farm_script, toolchain, {k: a[7:19] for k, a in artifacts.items()},
                                      None, "")
            baseline: list[Command] = []
            if args.baseline_tree:
                # Its own indexes: an older ctxfarm may key the same build differently. Its
                # warm-up run below compiles; the timed runs are cached.
                base_homes = homes_for("baseline")
                baseline = shell_commands(base_homes, model, farm_script, toolchain,
                                          dict.fromkeys(base_homes, "qnn:SM8650"), args.baseline_tree.resolve(),
                                          "baseline:")
            for c in commands + baseline:
                c.run(warm_up=True)  # writes the bytecode caches, fills the page cache (baseline: builds)
            for i in range(args.runs):
                for c in commands + (baseline if i < args.baseline_runs else []):
                    c.run()
        finally:
            for name in pg_names:
                drop_postgres(args.admin_url, name)
    report(args, model, inproc, commands, baseline)
    return 0


def in_process(homes: dict[str, dict[str, str]], model: Path, repeat: int
               ) -> tuple[list[tuple[str, float]], dict[str, str], str]:
    rows: list[tuple[str, float]] = []
    artifacts: dict[str, str] = {}
    toolchain = ""
    for kind, env in homes.items():
        settings = Settings.from_env(env)
        reg = Registry.open(settings)
        t0 = time.perf_counter()
        first = build(settings, model, TARGETS, name="bench", tag="stable", registry=reg)
        first_s = time.perf_counter() - t0
        assert all(o.state == "built" for o in first.outcomes), first.outcomes
        artifacts[kind] = first.outcomes[0].artifact or ""
        toolchain = first.outcomes[0].toolchain
        live_worker(reg)
        full, fast = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            again = build(settings, model, TARGETS, name="bench", tag="stable", registry=reg)
            full.append(time.perf_counter() - t0)
            assert all(o.state == "cached" for o in again.outcomes)
            t0 = time.perf_counter()
            quick = answer(settings, model, TARGETS, name="bench", tag="stable")
            fast.append(time.perf_counter() - t0)
            assert quick is not None and all(o.state == "cached" for o in quick.outcomes)
        reg.close()
        compile_s = sum(o.compile_seconds or 0 for o in first.outcomes)
        if kind == "SQLite":
            rows.append(("EP compile (session creation, sum of 2 targets)", compile_s))
            rows.append(("compile job (sum of 2 targets' wall)", sum(o.wall_seconds or 0 for o in first.outcomes)))
        rows.append((f"{kind}: first farm build, in-process (compile + publish)", first_s))
        rows.append((f"{kind}: cached plan.build, in-process, p50 of {repeat}", statistics.median(full)))
        rows.append((f"{kind}: cached answer (CLI fast path), in-process, p50 of {repeat}", statistics.median(fast)))
    return rows, artifacts, toolchain


def live_worker(reg: Registry) -> None:
    """A worker row for the local QNN toolchain (the one the builds used): what `farm submit`
    with no --sdk takes its toolchains from."""
    from registry.index import register_worker
    from workers.backends import get_runner

    with reg.db.session() as s:
        register_worker(s, name="bench-worker", host="bench", pid=os.getpid(), queues=["bench"],
                        toolchain=get_runner("qnn").toolchain())


def shell_commands(homes: dict[str, dict[str, str]], model: Path, farm_script: Path, toolchain: str,
                   expect_resolved: dict[str, str], tree: Path | None, prefix: str) -> list[Command]:
    py = sys.executable
    base_env = child_env(homes["SQLite"], tree)
    out = []
    if tree is None:
        out.append(Command("interpreter start: python -c pass", [py, "-c", "pass"], base_env))
    out.append(Command(f"{prefix}`farm --help`", [str(farm_script), "--help"], base_env, "usage: farm"))
    out.append(Command(f"{prefix}`python -m farm.cli --help`", [py, "-m", "farm.cli", "--help"], base_env,
                       "usage: farm"))
    for kind, env in homes.items():
        build_cmd, resolve_cmd = farm_commands(f"{prefix}{kind}:", [str(farm_script)], child_env(env, tree), model,
                                               toolchain, expect_resolved[kind])
        out += [build_cmd, resolve_cmd]
        if tree is None:
            # A cached re-submission (cluster mode, no --server): the toolchains from the live
            # worker row in_process recorded (heartbeats an hour apart keep it live through the
            # runs), the release recorded over a bare connection.
            submit = ["submit", *build_cmd.argv[2:]]
            out.append(Command(f"{kind}: cached `farm submit` ({len(TARGETS)} targets)",
                               [str(farm_script), *submit], {**build_cmd.env, "FARM_HEARTBEAT_SECONDS": "3600"},
                               " cached ", len(TARGETS)))  # every build answered from the index
        if tree is None and kind == "SQLite":
            out.append(Command("SQLite: `python -m farm.cli resolve`", [py, "-m", "farm.cli", *resolve_cmd.argv[1:]],
                               resolve_cmd.env, resolve_cmd.expect))
    return out


def report(args: argparse.Namespace, model: Path, inproc: list[tuple[str, float]],
           commands: list[Command], baseline: list[Command]) -> None:
    start = statistics.median(commands[0].wall)
    print(f"model light_{args.model}, targets {', '.join(TARGETS)}; "
          f"bytecode caching on in the children; {args.runs} runs each (baseline {args.baseline_runs})")
    print(f"\n{'in process':64s} {'seconds':>10s}")
    for name, secs in inproc:
        print(f"{name:64s} {secs:10.4f}")
    print(f"\n{'from the shell (ms)':52s} {'median':>7s} {'p90':>7s} {'min':>7s} {'cpu':>7s} {'less start':>10s}")
    rows = []
    for c in commands + baseline:
        walls = sorted(c.wall)
        med, p90 = statistics.median(walls), walls[min(len(walls) - 1, int(0.9 * len(walls)))]
        cpu = statistics.median(c.cpu)
        less = med - start if c is not commands[0] else 0.0
        print(f"{c.label:52s} {med * 1e3:7.1f} {p90 * 1e3:7.1f} {walls[0] * 1e3:7.1f} {cpu * 1e3:7.1f} "
              f"{less * 1e3:10.1f}")
        rows.append({"command": c.label, "argv": c.argv[1:], "runs": len(walls), "median_ms": med * 1e3,
                     "p90_ms": p90 * 1e3, "min_ms": walls[0] * 1e3, "cpu_median_ms": cpu * 1e3,
                     "less_start_ms": less * 1e3})
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "cache.json").write_text(json.dumps({"model": args.model, "targets": TARGETS,
                                                "in_process": [{"measure": n, "seconds": s} for n, s in inproc],
                                                "shell": rows}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
