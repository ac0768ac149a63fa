"""The registry at the terminal, for real (embedded: SQLite + local blobs, real QNN compiles):
tags that move only on purpose, bare names, the options column, coverage by model digest, the
probe evidence in show / coverage / resolve, and --json that validates against the schema each
command ships (farm/cli/schemas/<command>.json)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.common.onnx_models import conv_relu_add
from tests.common.registry_state import snapshot

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "farm" / "cli" / "schemas"
VENV_247 = ROOT / ".venvs" / "qnn-2.47.0" / "bin" / "python"


def valid(command: str, text: str) -> Any:
    """Parse a command's --json output and validate it against the schema the CLI ships."""
    doc = json.loads(text)
    schema = json.loads((SCHEMAS / f"{command}.json").read_text())
    errors = sorted(Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, f"{command}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    return doc


def digest_of(env: dict[str, str], ref: str) -> str:
    shown = json.loads(farm(env, "ls", "--model", ref, "--json").stdout)
    assert len({r["model"] for r in shown}) == 1
    return str(shown[0]["model"])


def test_schemas_are_draft_2020_12_and_ship_with_the_package() -> None:
    files = sorted(SCHEMAS.glob("*.json"))
    mine = {"ls", "show", "coverage", "coverage-missing", "resolve", "fetch", "tag", "untag", "registry-verify",
            "registry-gc", "keys-create", "keys-public", "keys-sign"}
    assert mine <= {p.stem for p in files}
    for p in files:
        schema = json.loads(p.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", p.name
        Draft202012Validator.check_schema(schema)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"farm.cli" = ["schemas/*.json"]' in pyproject


def test_a_tag_moves_only_with_force_and_says_what_moved(settings: Settings, farm_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    a = conv_relu_add(tmp_path / "a.onnx", seed=0)
    b = conv_relu_add(tmp_path / "b.onnx", seed=1)
    first = json.loads(farm(farm_env, "build", str(a), "-t", "qnn:SM8650", "--name", "net", "--tag", "stable",
                            "--json").stdout)
    art_a, model_a = first["builds"][0]["artifact"], first["model"]

    # Another model under the same NAME:TAG: refused before anything is compiled or recorded.
    before = snapshot(settings)["rows"]
    refused = farm(farm_env, "build", str(b), "-t", "qnn:SM8650", "--name", "net", "--tag", "stable", check=False)
    assert refused.returncode == 1 and "error[tag-conflict]" in refused.stderr, refused.stderr
    assert "--force-tag" in refused.stderr and "Traceback" not in refused.stderr
    after = snapshot(settings)["rows"]
    assert {k: after[k] for k in ("tags", "builds", "artifacts")} == {k: before[k] for k in ("tags", "builds",
                                                                                            "artifacts")}
    assert digest_of(farm_env, "net:stable") == model_a

    moved = farm(farm_env, "build", str(b), "-t", "qnn:SM8650", "--name", "net", "--tag", "stable", "--force-tag")
    model_b = digest_of(farm_env, "net:stable")
    assert model_b != model_a
    assert f"moved net:stable: {model_a} -> {model_b}" in moved.stderr

    # farm tag: an artifact id names its model; moving back needs --force too.
    no = farm(farm_env, "tag", "net:stable", art_a[7:19], check=False)
    assert no.returncode == 1 and "error[tag-conflict]" in no.stderr
    assert digest_of(farm_env, "net:stable") == model_b
    back = valid("tag", farm(farm_env, "tag", "net:stable", art_a[7:19], "--force", "--json").stdout)
    assert (back["digest"], back["previous"], back["moved"], back["artifact"]) == (model_a, model_b, True, art_a)
    text = farm(farm_env, "tag", "net:v1", "net:stable").stdout
    assert text.strip() == f"tagged net:v1 -> {model_a}"
    same = farm(farm_env, "tag", "net:v1", model_a[:19])  # a digest prefix; the same model: nothing moves
    assert "already points at" in same.stdout

    hist = valid("tag", farm(farm_env, "tag", "--history", "net:stable", "--json").stdout)
    assert [(e["action"], e["digest"], e["previous"]) for e in hist["history"]] == [
        ("created", model_a, None), ("moved", model_b, model_a), ("moved", model_a, model_b)]
    assert "WHEN" in farm(farm_env, "tag", "--history", "net:stable").stdout

    gone = valid("untag", farm(farm_env, "untag", "net:v1", "--json").stdout)
    assert gone == {"ref": "net:v1", "name": "net", "tag": "v1", "deleted": True, "digest": model_a}
    missing = farm(farm_env, "resolve", "-m", "net:v1", "--soc", "SM8650", "--qnn", "2.51.0", check=False)
    assert missing.returncode == 1 and "error[not-found]" in missing.stderr and "net:stable" in missing.stderr
    again = farm(farm_env, "untag", "net:v1", check=False)
    assert again.returncode == 1 and "error[not-found]" in again.stderr
    usage = farm(farm_env, "tag", "net:stable", check=False)
    assert usage.returncode == 2 and "error[usage]" in usage.stderr


def test_bare_names_options_column_and_coverage_by_digest(settings: Settings, farm_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    a = conv_relu_add(tmp_path / "a.onnx", seed=0)
    b = conv_relu_add(tmp_path / "b.onnx", seed=1)
    farm(farm_env, "build", str(a), "-t", "qnn:SM8650", "--name", "squeeze", "--tag", "stable")
    farm(farm_env, "build", str(a), "-t", "qnn:SM8650", "--name", "squeeze", "--tag", "candidate",
         "-o", "graph_optimization=3")
    farm(farm_env, "build", str(b), "-t", "qnn:SM8650", "--name", "squeeze", "--tag", "v2")

    # A bare name lists every tag of it (there is no squeeze:latest); resolve reads NAME:latest
    # and says which tags exist.
    rows = valid("ls", farm(farm_env, "ls", "--model", "squeeze", "--json").stdout)
    assert len(rows) == 3 and len({r["model"] for r in rows}) == 2
    for r in rows:
        assert isinstance(r["compile_seconds"], float) and r["compile_seconds"] > 0
        assert isinstance(r["size_bytes"], int) and r["size_bytes"] > 1000
        assert isinstance(r["tags"], list) and r["created_at"].endswith("Z")
    by_opts = sorted(((r["options"], tuple(r["tags"])) for r in rows if "squeeze:stable" in r["tags"]),
                     key=lambda o: len(o[0]))
    assert by_opts == [({}, ("squeeze:candidate", "squeeze:stable")),
                       ({"graph_optimization": 3}, ("squeeze:candidate", "squeeze:stable"))]
    table = farm(farm_env, "ls", "-m", "squeeze").stdout
    assert "OPTIONS" in table.splitlines()[0] and "graph_optimization=3" in table
    assert len(valid("ls", farm(farm_env, "ls", "-m", "squeeze:v2", "--json").stdout)) == 1
    nope = farm(farm_env, "resolve", "-m", "squeeze", "--soc", "SM8650", "--qnn", "2.51.0", check=False)
    assert nope.returncode == 1 and "squeeze has no tag latest" in nope.stderr
    assert "squeeze:candidate, squeeze:stable, squeeze:v2" in nope.stderr

    # Coverage: one row per model digest, with all of its tags.
    cov = valid("coverage", farm(farm_env, "coverage", "--json").stdout)
    assert sorted(tuple(m["tags"]) for m in cov["models"]) == [("squeeze:candidate", "squeeze:stable"),
                                                                ("squeeze:v2",)]
    assert len(cov["cells"]) == 2 and {c["builds"] for c in cov["cells"]} == {2, 1}
    text = farm(farm_env, "coverage").stdout.splitlines()
    assert text[0].split()[:3] == ["MODEL", "TAGS", "TARGET"] and "QNN 2.51.0" in text[0]
    assert sum("squeeze:candidate, squeeze:stable" in line for line in text) == 1
    only = valid("coverage", farm(farm_env, "coverage", "-m", "squeeze:v2", "--json").stdout)
    assert [m["tags"] for m in only["models"]] == [["squeeze:v2"]]
    missing = farm(farm_env, "coverage", "-m", "squeeze", "--missing", "-t", "qnn:SM8750", "--json", check=False)
    assert missing.returncode == 1 and len(valid("coverage-missing", missing.stdout)) == 2


def test_typed_json_of_show_resolve_fetch_registry_and_keys(settings: Settings, farm_env: dict[str, str],
                                                             tmp_path: Path) -> None:
    model = conv_relu_add(tmp_path / "net.onnx")
    art = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--name", "net", "--json")
                     .stdout)["builds"][0]["artifact"]
    shown = valid("show", farm(farm_env, "show", art[7:19], "--json").stdout)
    assert shown["compile_seconds"] > 0 and isinstance(shown["size_bytes"], int)
    (v,) = shown["verdicts"]
    assert (v["runtime"], v["verdict"], v["source"], v["self_probe"]) == ("2.51.0", "loads", "probe", True)

    res = valid("resolve", farm(farm_env, "resolve", "-m", "net", "--soc", "SM8650", "--qnn", "2.51.0",
                                "--json").stdout)
    assert (res["source"], res["reason"].startswith("loaded under QNN 2.51.0 on ")) == ("probe", True)
    assert res["probed_at"].endswith("Z") and all(isinstance(f["size"], int) for f in res["files"])
    fetched = valid("fetch", farm(farm_env, "fetch", "-m", "net", "--soc", "SM8650", "--qnn", "2.51.0",
                                  "--out", str(tmp_path / "dev"), "--json").stdout)
    assert fetched["picked"]["source"] == "probe" and fetched["bytes"] == shown["size_bytes"]
    by_id = valid("fetch", farm(farm_env, "fetch", art[7:19], "--out", str(tmp_path / "dev2"), "--json").stdout)
    assert by_id["picked"] is None and by_id["artifact"] == art

    ver = valid("registry-verify", farm(farm_env, "registry", "verify", "--json").stdout)
    assert ver["ok"] is True and ver["artifacts"] == 1 and ver["bytes"] > 0
    gc = valid("registry-gc", farm(farm_env, "registry", "gc", "--dry-run", "--grace", "1h", "--json").stdout)
    assert gc["grace_seconds"] == 3600.0 and gc["dry_run"] is True and gc["deleted"] == []

    key = tmp_path / "release.key"
    created = valid("keys-create", farm(farm_env, "keys", "create", str(key), "--json").stdout)
    pub = valid("keys-public", farm(farm_env, "keys", "public", str(key), "--json").stdout)
    assert pub == {"public_key": created["public_key"], "key_id": created["key_id"]}
    signed = valid("keys-sign", farm({**farm_env, "FARM_SIGNING_KEY": str(key)}, "keys", "sign", art[7:19],
                                     "--json").stdout)
    assert signed == {"artifact": art, "key_id": created["key_id"], "public_key": created["public_key"]}


def _probe_in(python: Path, env: dict[str, str], artifact_id: int) -> str:
    """Load an artifact under the toolchain of another venv and record the verdict (what a
    probe worker does), through the real Executor."""
    code = ("import sys; from farm.core.settings import Settings; from farm.pipeline.execute import Executor; "
            "from registry.index import Registry; s = Settings.from_env(); r = Registry.open(s); "
            "print(Executor(s, r, backend='qnn').probe(int(sys.argv[1]))); r.close()")
    out = subprocess.run([str(python), "-c", code, str(artifact_id)], env=env, capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def _artifact_row_id(settings: Settings, digest: str) -> int:
    from registry.index import Registry, find_artifact

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return find_artifact(s, digest).id
    finally:
        reg.close()


@pytest.mark.skipif(not VENV_247.exists(), reason="no QNN 2.47.0 worker venv (infra/workers/create-venvs.sh)")
def test_probe_evidence_is_visible_in_show_coverage_and_resolve(settings: Settings, farm_env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    import sys

    model = conv_relu_add(tmp_path / "net.onnx")
    env_247 = {**farm_env, "PATH": f"{VENV_247.parent}:{farm_env.get('PATH', '')}"}
    old = subprocess.run([str(VENV_247), "-m", "farm.cli", "build", str(model), "-t", "qnn:SM8650", "--name", "net",
                          "--json"], env=env_247, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert old.returncode == 0, old.stderr
    art_247 = json.loads(old.stdout)["builds"][0]["artifact"]
    art_251 = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--name", "net", "--json")
                         .stdout)["builds"][0]["artifact"]
    assert art_247 != art_251
    # The measured compatibility: a newer runtime loads an older context, not the reverse.
    assert _probe_in(Path(sys.executable), farm_env, _artifact_row_id(settings, art_247)) == "loads"
    assert _probe_in(VENV_247, env_247, _artifact_row_id(settings, art_251)) == "fails"

    shown = valid("show", farm(farm_env, "show", art_251[7:19], "--json").stdout)
    verdicts = {(v["runtime"], v["verdict"], v["self_probe"]) for v in shown["verdicts"]}
    assert verdicts == {("2.47.0", "fails", False), ("2.51.0", "loads", True)}
    assert next(v for v in shown["verdicts"] if v["runtime"] == "2.47.0")["detail"]
    text = farm(farm_env, "show", art_251[7:19]).stdout
    assert "RUNTIME" in text and "QNN 2.47.0  fails" in text and "QNN 2.51.0  loads" in text

    cov = valid("coverage", farm(farm_env, "coverage", "--json").stdout)
    matrix = {(c["toolchain"], v["runtime"]): v["verdict"] for c in cov["cells"] for v in c["verdicts"]}
    assert matrix == {("2.47.0", "2.47.0"): "loads", ("2.47.0", "2.51.0"): "loads",
                      ("2.51.0", "2.47.0"): "fails", ("2.51.0", "2.51.0"): "loads"}
    lines = farm(farm_env, "coverage", "--verdicts").stdout.splitlines()
    assert "BUILT WITH" in lines[0] and "QNN 2.47.0" in lines[0] and "QNN 2.51.0" in lines[0]
    row = {line.split()[3]: line.split()[4:6] for line in lines[1:3]}
    assert row == {"2.47.0": ["loads", "loads"], "2.51.0": ["fails", "loads"]}

    by_probe = farm(farm_env, "resolve", "-m", "net", "--soc", "SM8650", "--qnn", "2.51.0").stdout
    assert by_probe.splitlines()[0].startswith(art_251[7:19])
    assert "  picked by probe: loaded under QNN 2.51.0 on " in by_probe and "probe: probe" not in by_probe
    by_rule = farm(farm_env, "resolve", "-m", "net", "--soc", "SM8650", "--qnn", "2.49.40").stdout
    assert by_rule.splitlines()[0].startswith(art_247[7:19])
    assert "  picked by rule: same SoC, built with QNN 2.47.0 <= runtime 2.49.40" in by_rule


def test_submit_moves_a_tag_only_with_force_tag(tmp_path: Path, farm_env: dict[str, str]) -> None:
    """`farm submit --name --tag`: queued (queue_release), answered from the index (every build
    final), and through the HTTP service (--server): the same refusal and the same report."""
    from infra.devfarm.services import free_port, start_redis
    from tests.common.service import serve, token

    redis = start_redis(tmp_path / "redis")  # its own: the messages sent here reach no worker
    env = {**farm_env, "FARM_HOME": str(tmp_path / "home"), "FARM_BROKER_URL": redis.url}
    settings = Settings.from_env(env)
    a, b = conv_relu_add(tmp_path / "a.onnx", seed=0), conv_relu_add(tmp_path / "b.onnx", seed=1)
    sub = ["-t", "qnn:SM8650", "--sdk", "2.51.0", "--allow-queue", "--name", "net", "--tag", "rc"]
    try:
        first = json.loads(farm(env, "submit", str(a), *sub, "--json").stdout)
        model_a = digest_of_release(settings, first["release"])
        refused = farm(env, "submit", str(b), *sub, check=False)
        assert refused.returncode == 1 and "error[tag-conflict]" in refused.stderr, refused.stderr
        moved = farm(env, "submit", str(b), *sub, "--force-tag", "--json")
        model_b = digest_of_release(settings, json.loads(moved.stdout)["release"])
        assert f"moved net:rc: {model_a} -> {model_b}" in moved.stderr

        # Every build of model a final: the answer comes from the index (_answer_cached), and
        # moving the tag back still needs --force-tag.
        from farm.pipeline.execute import Executor
        from registry.index import Registry

        reg = Registry.open(settings)
        try:
            assert [Executor(settings, reg).execute(bd["build"]).outcome for bd in first["builds"]] == ["succeeded"]
        finally:
            reg.close()
        again = farm(env, "submit", str(a), *sub, check=False)
        assert again.returncode == 1 and "error[tag-conflict]" in again.stderr
        back = farm(env, "submit", str(a), *sub, "--force-tag", "--json")
        assert json.loads(back.stdout)["builds"][0]["state"] == "succeeded"
        assert f"moved net:rc: {model_b} -> {model_a}" in back.stderr
    finally:
        redis.stop()

    # Through the service (embedded: no broker), the upload carries the tag.
    served = {k: v for k, v in env.items() if k != "FARM_BROKER_URL"}
    port = free_port()
    server = serve(served, port, tmp_path / "serve.log")
    try:
        remote = ["--server", f"http://127.0.0.1:{port}", "--token", token(settings, "pipeline", "submit")]
        no = farm(served, "submit", str(b), "-t", "qnn:SM8650", "--name", "net", "--tag", "rc", *remote, check=False)
        assert no.returncode == 1 and "error[tag-conflict]" in no.stderr, no.stderr
        yes = farm(served, "submit", str(b), "-t", "qnn:SM8650", "--name", "net", "--tag", "rc", "--force-tag",
                   *remote)
        assert f"moved net:rc: {model_a} -> {model_b}" in yes.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def digest_of_release(settings: Settings, release_id: int) -> str:
    from registry.index import Registry
    from registry.models import Release

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            rel = s.get(Release, release_id)
            assert rel is not None
            return rel.model_digest
    finally:
        reg.close()


def test_show_takes_a_model_reference_like_every_other_command(settings: Settings, farm_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    """`farm show NAME:TAG`: the model's one artifact, --target narrowing it; a model
    with several is a usage error listing their ids; locally and through the service alike."""
    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from tests.common.service import token

    model = conv_relu_add(tmp_path / "net.onnx")
    builds = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "net",
                             "--json").stdout)["builds"]
    by_target = {b["target"]: b["artifact"] for b in builds}
    for ref in ("net:latest", "net", digest_of(farm_env, "net:latest")):
        shown = valid("show", farm(farm_env, "show", ref, "--target", "qnn:SM8750", "--json").stdout)
        assert shown["artifact"] == by_target["qnn:SM8750"], ref
    both = farm(farm_env, "show", "net:latest", check=False)
    assert both.returncode == 2 and "net:latest has 2 artifacts" in both.stderr, both.stderr
    assert all(a[7:19] in both.stderr for a in by_target.values()) and "--target" in both.stderr
    none = farm(farm_env, "show", "net:latest", "-t", "qnn:SM8550", check=False)
    assert none.returncode != 0 and "has no artifact for qnn:SM8550" in none.stderr, none.stderr
    assert "Traceback" not in none.stderr + both.stderr
    assert farm(farm_env, "show", "nope:latest", check=False).returncode != 0
    # An artifact id still means the artifact.
    assert valid("show", farm(farm_env, "show", by_target["qnn:SM8650"][7:19], "--json").stdout)["target"] == \
        "qnn:SM8650"

    tok = token(settings, "reader", "read")
    with TestClient(create_app(settings)) as c:
        c.headers["Authorization"] = f"Bearer {tok}"
        r = c.get("/v1/artifacts/net:latest", params={"target": "qnn:SM8650"})
        assert r.status_code == 200 and r.json()["artifact"] == by_target["qnn:SM8650"], r.text
        r = c.get("/v1/artifacts/net:latest")
        assert r.status_code == 400 and r.json()["error"]["code"] == "usage", r.text
        r = c.get("/v1/artifacts/net:nope")
        assert r.status_code == 404, r.text
