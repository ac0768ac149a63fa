"""Read commands against a live `farm serve`: in a shell with FARM_SERVER and
FARM_TOKEN and no index of its own, `farm ls`, `show`, `workers`, `coverage --missing` and
`status --build` answer what the service's index holds (the same JSON the service host prints
locally), never an empty SQLite index made on the spot; a command with no remote form says
`local-only`. A real QNN compile of a small model behind it."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from farm.pipeline.plan import build
from infra.devfarm.services import free_port
from registry.index import Registry, register_worker
from tests.common.cli import farm, heavy, modules
from tests.common.onnx_models import light
from tests.common.schemas import valid
from tests.common.service import serve, token


@pytest.fixture(scope="module")
def farm_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("remote-home")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    host_env = {**base, "FARM_HOME": str(home)}
    settings = Settings.from_env(host_env)
    (o,) = build(settings, light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable").outcomes
    assert o.state == "built", o
    from workers.runner import Toolchain

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            register_worker(s, name="w-remote@test", host="test", pid=os.getpid(),
                            toolchain=Toolchain("qnn", o.toolchain, "1.31.1", "onnxruntime-qnn", "2.7.0"),
                            queues=[f"ctxfarm.qnn.{o.toolchain}"])
    finally:
        reg.close()
    read = token(settings, "remote-read", "read")
    submit = token(settings, "remote-submit", "submit")
    admin = token(settings, "remote-admin", "admin")
    port = free_port()
    proc = serve(host_env, port, home / "serve.log")
    try:
        yield {"host_env": host_env, "server": f"http://127.0.0.1:{port}", "read": read, "submit": submit, "admin": admin,
               "outcome": o,
               "home": home}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture
def pipeline_env(farm_service: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """A pipeline shell: FARM_SERVER and FARM_TOKEN, and an empty FARM_HOME."""
    env = {k: v for k, v in farm_service["host_env"].items() if k != "FARM_HOME"}
    return {**env, "FARM_HOME": str(tmp_path / "pipeline-home"), "FARM_SERVER": farm_service["server"],
            "FARM_TOKEN": farm_service["read"]}


def _json(env: dict[str, str], *args: str, rc: int = 0) -> Any:
    proc = farm(env, *args, "--json", check=False)
    assert proc.returncode == rc, f"farm {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_read_commands_answer_from_the_service(farm_service: dict[str, Any], pipeline_env: dict[str, str]) -> None:
    host = farm_service["host_env"]
    o = farm_service["outcome"]
    # ls: the service's artifacts, exactly what `farm ls` prints on the service's host.
    remote = valid("ls", _json(pipeline_env, "ls"))
    assert [r["artifact"] for r in remote] == [o.artifact]
    assert remote == _json(host, "ls")
    assert _json(pipeline_env, "ls", "-m", "sq:stable", "-t", "qnn:SM8650") == remote
    assert _json(pipeline_env, "ls", "-t", "qnn:SM8750") == []
    # show, by id and by digest.
    short = remote[0]["id"]
    shown = valid("show", _json(pipeline_env, "show", short))
    assert shown == _json(host, "show", short) and shown["artifact"] == o.artifact
    assert _json(pipeline_env, "show", o.artifact)["id"] == short
    text = farm(pipeline_env, "show", short).stdout
    assert o.artifact in text and "files" in text
    # workers: the same document as on the host (its clock-dependent field aside).
    workers = valid("workers", _json(pipeline_env, "workers"))
    local = _json(host, "workers")
    assert [w["worker"] for w in workers] == ["w-remote@test"]
    assert [{**w, "last_seen_seconds": 0} for w in workers] == [{**w, "last_seen_seconds": 0} for w in local]
    # coverage --missing: SM8750 was never built (exit 1), the same rows as the host computes.
    missing = valid("coverage-missing", _json(pipeline_env, "coverage", "--missing", "-t", "qnn:SM8650",
                                               "-t", "qnn:SM8750", rc=1))
    assert missing == _json(host, "coverage", "--missing", "-t", "qnn:SM8650", "-t", "qnn:SM8750", rc=1)
    assert [(r["target"], r["state"]) for r in missing] == [("qnn:SM8750", "missing")]
    assert _json(pipeline_env, "coverage", "--missing") == []
    # status --build: the phases too, page faults as a count.
    build_doc = valid("status", _json(pipeline_env, "status", "--build", str(o.build_id)))
    assert build_doc["phases"] and build_doc["phases"] == _json(host, "status", "--build", str(o.build_id))["phases"]
    lines = farm(pipeline_env, "status", "--build", str(o.build_id)).stdout.splitlines()
    phases = next(line for line in lines if line.startswith("phases"))
    assert "ep_compile" in phases and " ms" in phases
    assert "page_faults" not in phases or not any(p.strip().startswith("child.page_faults") and p.endswith("ms")
                                                   for p in phases.split(","))
    # Sizes in their own unit: the compile child's peak RSS is KiB/MiB, never ms.
    for part in phases.split(","):
        if "peak_rss_kib" in part:
            assert part.endswith(("MiB", "KiB")), phases
    # None of it made an index in the pipeline shell.
    assert not Path(pipeline_env["FARM_HOME"], "index.db").exists()


def test_remote_reads_import_no_database_or_store(pipeline_env: dict[str, str]) -> None:
    for args in (["ls"], ["workers"], ["coverage"]):
        proc = farm(pipeline_env, *args, "--json", importtime=True)
        assert heavy(modules(proc.stderr)) == [], (args, heavy(modules(proc.stderr)))


def test_a_command_with_no_remote_form_says_so(pipeline_env: dict[str, str]) -> None:
    for args in (["registry", "verify"], ["db", "current"], ["keys", "sign", "abcdef"],
                 ["token", "create", "dev", "--scope", "read"]):
        proc = farm(pipeline_env, *args, "--json", check=False)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert json.loads(proc.stdout)["error"]["code"] == "local-only", args
        assert "Traceback" not in proc.stderr
    assert not Path(pipeline_env["FARM_HOME"], "index.db").exists()
    proc = farm(pipeline_env, "registry", "verify", "--server", pipeline_env["FARM_SERVER"], check=False)
    assert proc.returncode == 2 and "has no remote form" in proc.stderr


def test_remote_reads_without_a_token_are_refused_with_a_working_hint(pipeline_env: dict[str, str]) -> None:
    env = {k: v for k, v in pipeline_env.items() if k != "FARM_TOKEN"}
    proc = farm(env, "ls", "--json", check=False)
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "unauthorized" and proc.returncode != 0
    assert "farm token create" in (err.get("hint") or "")


def test_a_missing_model_file_is_invalid_model_not_storage(pipeline_env: dict[str, str], tmp_path: Path) -> None:
    proc = farm(pipeline_env, "submit", str(tmp_path / "nope.onnx"), "-t", "qnn:SM8650", "--json", check=False)
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "invalid-model", err
    assert "free space" not in (err.get("hint") or "") and str(tmp_path) not in (err.get("hint") or "")


def test_a_cached_release_says_cached_as_farm_build_does(farm_service: dict[str, Any],
                                                         pipeline_env: dict[str, str]) -> None:
    o = farm_service["outcome"]
    env = {**pipeline_env, "FARM_TOKEN": farm_service["submit"]}
    proc = farm(env, "submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", o.toolchain, "--wait")
    assert f"build {o.build_id} qnn:SM8650 {o.toolchain}: cached" in proc.stderr, proc.stderr
    assert "succeeded after 0.0 s" not in proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith(str(o.build_id)))
    assert " cached " in f" {row} " and "succeeded" not in row


@pytest.mark.parametrize("path,code", [
    ("/v1/artifacts?limit=0", None),
    ("/v1/artifacts?limit=100000000", None),
    ("/v1/artifacts?target=qnn:NOPE", "unknown-target"),
    ("/v1/artifacts?target=" + "x" * 500, None),
    ("/v1/artifacts?model=..%2F..%2Fetc", None),
    ("/v1/artifacts/..%2F..%2Fetc%2Fpasswd", None),
    ("/v1/artifacts/zzzzzz", "not-found"),  # a model NAME (farm show NAME:TAG) that is not there
    ("/v1/artifacts/%21bad%20name", "bad-name"),
    ("/v1/artifacts/" + "a" * 64, "not-found"),
    ("/v1/workers?all=maybe", None),
])
def test_hostile_reads_get_a_coded_error(farm_service: dict[str, Any], path: str, code: str | None) -> None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(farm_service["server"] + path,
                                 headers={"Authorization": f"Bearer {farm_service['read']}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert 400 <= info.value.code < 500, info.value.code
    err = json.loads(info.value.read())["error"]
    assert err["code"] and err["message"]
    if code is not None:
        assert err["code"] == code, err
    assert str(farm_service["home"]) not in json.dumps(err)  # no server path in an answer


def test_tags_through_the_service(farm_service: dict[str, Any], pipeline_env: dict[str, str]) -> None:
    host = farm_service["host_env"]
    o = farm_service["outcome"]
    env = {**pipeline_env, "FARM_TOKEN": farm_service["admin"]}
    short = o.artifact.removeprefix("sha256:")[:12]
    tagged = valid("tag", _json(env, "tag", "sq:remote", short))
    assert (tagged["ref"], tagged["changed"], tagged["moved"]) == ("sq:remote", True, False)
    assert tagged["artifact"] == o.artifact and tagged["digest"] == _json(host, "show", short)["model"]
    again = _json(env, "tag", "sq:remote", short)
    assert (again["changed"], again["moved"]) == (False, False)
    assert "already points at" in farm(env, "tag", "sq:remote", short).stdout
    history = valid("tag", _json(env, "tag", "--history", "sq:remote"))
    assert history == _json(host, "tag", "--history", "sq:remote")
    gone = valid("untag", _json(env, "untag", "sq:remote"))
    assert gone["deleted"] and gone["digest"] == tagged["digest"]
    assert _json(host, "tag", "--history", "sq:remote")["digest"] is None
    # A read token cannot move tags: 403, said as forbidden.
    proc = farm(pipeline_env, "tag", "sq:other", short, "--json", check=False)
    assert json.loads(proc.stdout)["error"]["code"] == "forbidden"
