"""A genai package through the HTTP service: `farm submit --genai DIR --server URL`
sends each file of the export once per digest, and only those the service lacks (a data file
the prefill and decode graphs share goes up once), then `POST /v1/genai` queues what `farm
submit --genai` queues on a cluster; the embedded service (no broker) builds the parts and then
the package in-process. The route's refusals are documented codes, nothing written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.core.keys import sha256_bytes, sha256_file
from farm.core.settings import Settings
from infra.devfarm.services import free_port
from tests.common.genai import make_export
from tests.common.registry_state import snapshot
from tests.common.schemas import valid
from tests.common.service import serve, token


def received(port: int) -> float:
    """The service's ``ctxfarm_upload_bytes_received_total``: the upload bytes it was sent."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(r"^ctxfarm_upload_bytes_received_total (\S+)$", text, re.M)
    assert m, text[:2000]
    return float(m.group(1))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({"FARM_HOME": str(home)})
    settings = Settings.from_env(env)
    tokens = {scope: token(settings, f"t-{scope}", scope) for scope in ("read", "submit")}
    port = free_port()
    proc = serve(env, port, tmp_path / "serve.log")
    bare = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "AWS_"))}
    bare["FARM_HOME"] = str(tmp_path / "client-home")
    try:
        yield {"port": port, "url": f"http://127.0.0.1:{port}", "tokens": tokens, "env": bare, "log": tmp_path / "serve.log"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert not check or proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_submit_genai_over_http_builds_installs_and_resubmits_for_nothing(served: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    export = make_export(tmp_path / "export")
    url, submit, read, env = served["url"], served["tokens"]["submit"], served["tokens"]["read"], served["env"]
    # What goes up: each file once per digest (context_i and iterator_i share context_i.onnx.data).
    sizes = {sha256_file(p)[0]: p.stat().st_size for p in export.iterdir()}
    st = valid("submit", cli(env, "submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag",
                             "h", "--wait", "--timeout", "240", "--server", url, "--token", submit, "--json").stdout)
    assert st["ok"] and st["done"] and len(st["builds"]) == 3, st
    assert st["uploaded_bytes"] == sum(sizes.values()) == received(served["port"])

    dest = tmp_path / "device"
    got = json.loads(cli(env, "install", "--server", url, "--token", read, "--model", "llm/tiny:h", "--soc", "SM8650",
                         "--qnn", "2.51.0", "--dest", str(dest), "--json").stdout)
    assert Path(got["ctx_model"]).name == "genai_config.json"
    assert sorted(p.name for p in dest.glob("*.bin")) == ["context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin"]
    assert (dest / "tokenizer.json").read_bytes() == (export / "tokenizer.json").read_bytes()

    # Again: every file held (nothing sent), every build answered from the index.
    again = cli(env, "submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag", "h",
                "--wait", "--server", url, "--token", submit, "--json")
    doc = valid("submit", again.stdout)
    assert doc["uploaded_bytes"] == 0 and doc["ok"]
    assert sorted(b["build"] for b in doc["builds"]) == sorted(b["build"] for b in st["builds"])
    assert received(served["port"]) == sum(sizes.values())
    human = cli(env, "submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag", "h",
                "--wait", "--server", url, "--token", submit)
    assert human.stdout.count("cached") == 3 and "0 sent" in human.stderr, human.stderr

    # A folder that can't be mapped is refused here, naming the file, before anything is sent.
    (export / "genai_config.json").write_text("{")
    bad = cli(env, "submit", "--genai", str(export), "-t", "qnn:SM8650", "--server", url, "--token", submit,
              check=False)
    assert bad.returncode == 2 and "error[bad-genai]" in bad.stderr and "genai_config.json" in bad.stderr
    assert received(served["port"]) == sum(sizes.values())
    assert "Traceback" not in served["log"].read_text()


def test_a_group_whose_graphs_share_a_data_file_sends_it_once(served: dict[str, Any], tmp_path: Path) -> None:
    """`farm submit --graph ... --server`: the decode graph's weights.data is the prefill's (the
    same digest): it goes up with the prefill's bundle, and the decode model is recorded from the
    blobs the service holds: its .onnx alone is sent."""
    from farm.client import _tar_parts
    from tests.common.groups import prefill_decode

    url, submit, env = served["url"], served["tokens"]["submit"], served["env"]
    prefill, decode = prefill_decode(tmp_path / "m", external=True)
    data = prefill.parent / "weights.data"
    assert sha256_file(data) == sha256_file(decode.parent / "weights.data")
    st = valid("submit", cli(env, "submit", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t",
                             "qnn:SM8650", "--server", url, "--token", submit, "--json").stdout)
    assert st["graphs"] == ["prefill", "decode"]
    first = _tar_parts([("model.onnx", prefill), ("weights.data", data)])[1]
    assert received(served["port"]) == first + decode.stat().st_size  # weights.data once
    cli(env, "submit", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650", "--server",
        url, "--token", submit, "--json")
    assert received(served["port"]) == first + decode.stat().st_size  # held: nothing more


# ---- the route's refusals (in-process, the embedded registry) -----------------------------------------

@pytest.fixture
def app(tmp_path: Path) -> Iterator[dict[str, Any]]:
    from registry.index import Registry
    from registry.tokens import create_token

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_MAX_UPLOAD_MB": "1"})
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tokens = {n: create_token(s, f"t-{n}", scope) for n, scope in
                  (("read", "read"), ("submit", "submit"), ("other", "submit"))}
    reg.close()
    with TestClient(create_app(settings)) as client:
        yield {"client": client, "settings": settings, "tokens": tokens}


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def test_hostile_genai_requests_are_documented_refusals_and_write_nothing(app: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    c, submit, other = app["client"], app["tokens"]["submit"], app["tokens"]["other"]
    config = b'{"model": {"type": "decoder-pipeline"}}'
    digest = sha256_bytes(config)
    # PUT: the body must hash to its digest; within FARM_MAX_UPLOAD_MB; a read token can't.
    assert c.put(f"/v1/blobs/{digest}", content=config, headers=auth(app["tokens"]["read"])).status_code == 403
    wrong = c.put(f"/v1/blobs/{digest}", content=config + b" ", headers=auth(submit))
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "usage"
    assert c.head(f"/v1/blobs/{digest}", headers=auth(submit)).status_code == 404
    big = b"x" * (1024 * 1024 + 1)
    r = c.put(f"/v1/blobs/{sha256_bytes(big)}", content=big, headers=auth(submit))
    assert r.status_code == 413 and r.json()["error"]["code"] == "too-large"
    assert c.put("/v1/blobs/sha256:zz", content=config, headers=auth(submit)).json()["error"]["code"] == "usage"
    # Sent by one token, held for every token: a blob is content, owned by no one (whoever names
    # its digest could GET it with a read token anyway); sending it again stores nothing.
    assert c.put(f"/v1/blobs/{digest}", content=config, headers=auth(submit)).json()["held"] is False
    assert c.put(f"/v1/blobs/{digest}", content=config, headers=auth(other)).json()["held"] is True
    assert c.head(f"/v1/blobs/{digest}", headers=auth(other)).status_code == 200
    before = snapshot(app["settings"])
    held = {"name": "genai_config.json", "digest": digest, "size": len(config)}
    body = {"targets": ["qnn:SM8650"]}
    cases = [
        ([held, {"name": "../tokenizer.json", "digest": digest, "size": len(config)}], 400, "bad-genai"),
        ([held, {"name": "sub/tokenizer.json", "digest": digest, "size": len(config)}], 400, "bad-genai"),
        ([held, held], 400, "bad-genai"),
        ([{**held, "name": "tokenizer.json"}], 400, "bad-genai"),  # no genai_config.json
        ([held, {"name": "context_0.onnx", "digest": "sha256:" + "1" * 64, "size": 5}], 404, "not-found"),
        ([{**held, "size": len(config) + 1}], 404, "not-found"),
        ([held, {"name": "context_0.onnx", "digest": "sha256:" + "1" * 64, "size": 10 ** 12}], 413, "too-large"),
        ([held], 400, "bad-genai"),  # held, but not a decoder pipeline the farm can map
        ([{**held, "digest": "sha256:../x"}], 400, None),
        ([{**held, "name": "x" * 200}], 400, None),
    ]
    for files, status, code in cases:
        r = c.post("/v1/genai", json={**body, "files": files}, headers=auth(submit))
        assert r.status_code == status, (files, r.text)
        if code:
            assert r.json()["error"]["code"] == code and r.json()["error"]["hint"], r.text
        assert "Traceback" not in r.text
    assert c.post("/v1/genai", json={**body, "files": [held]}).status_code == 401
    assert c.post("/v1/genai", json={**body, "files": [held]}, headers=auth(app["tokens"]["read"])).status_code == 403
    r = c.post("/v1/genai", json={"targets": ["qnn:SM9999"], "files": [held]}, headers=auth(submit))
    assert r.json()["error"]["code"] == "unknown-target"
    assert snapshot(app["settings"]) == before
    assert not [p for p in (app["settings"].home / "uploads").iterdir() if p.name.startswith("upload-")]


def test_the_embedded_service_builds_a_package_with_its_fan_in_under_the_token_quota(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker: the parts' builds and then the package's run on the service's own runner; the
    package's release is the token's (FARM_QUOTA_RELEASES counts it). Submitted again, the
    service reads the folder it lays out without hashing a file: each blob was verified as it
    was copied (farm.core.digests.remember)."""
    from registry.index import Registry
    from registry.tokens import create_token

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_QUOTA_RELEASES": "1"})
    reg = Registry.open(settings)
    with reg.db.session() as s:
        submit = create_token(s, "t", "submit")
    reg.close()
    export = make_export(tmp_path / "export")
    files = [{"name": p.name, "digest": sha256_file(p)[0], "size": p.stat().st_size} for p in sorted(export.iterdir())]
    with TestClient(create_app(settings)) as c:
        for f in files:
            if c.head(f"/v1/blobs/{f['digest']}", headers=auth(submit)).status_code == 404:
                assert c.put(f"/v1/blobs/{f['digest']}", content=(export / f["name"]).read_bytes(),
                             headers=auth(submit)).status_code == 200
        r = c.post("/v1/genai", json={"files": files, "targets": ["qnn:SM8650"], "name": "llm/e", "tag": "t"},
                   headers=auth(submit))
        assert r.status_code == 200, r.text
        st = r.json()
        assert len(st["builds"]) == 3 and not st["done"]
        from registry.models import BlobPut

        reg = Registry.open(settings)
        with reg.db.session() as s:  # the package's files: no longer counted against the token's bytes quota
            assert s.query(BlobPut).count() == 0
        reg.close()
        busy = c.post("/v1/genai", json={"files": files, "targets": ["qnn:SM8650"]}, headers=auth(submit))
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "quota-releases"
        import time

        deadline = time.monotonic() + 240
        while not st["done"] and time.monotonic() < deadline:
            st = c.get(f"/v1/releases/{st['release']}?wait=5", headers=auth(submit)).json()
        assert st["ok"], st
        res = c.get("/v1/resolve?model=llm/e:t&soc=SM8650&qnn=2.51.0", headers=auth(submit)).json()
        names = {f["name"] for f in res["files"]}
        assert {"genai_config.json", "context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin", "tokenizer.json"} <= names

        from farm.core import digests, keys

        hashed: list[str] = []

        def counted(path: Path) -> tuple[str, int]:
            hashed.append(Path(path).name)
            return sha256_file(path)

        monkeypatch.setattr(keys, "sha256_file", counted)
        monkeypatch.setattr(digests, "sha256_file", counted)
        again = c.post("/v1/genai", json={"files": files, "targets": ["qnn:SM8650"], "name": "llm/e", "tag": "t"},
                       headers=auth(submit))
        assert again.status_code == 200 and again.json()["done"] and again.json()["ok"], again.text
        assert hashed == [], hashed  # the export's files, each hashed once: as the service copied it


# ---- no exception is lost in a thread ---------------------------------------------------------------

# Each stage of the embedded runner's build and of the package's fan-in (module, attribute): made to
# raise in turn, as a bug would. The pool future's exception is read by no one.
RAISING_STAGES = [
    ("farm.pipeline.execute", "Executor.execute"),          # a part's (any build's) executor
    ("farm.pipeline.states", "claim"),                      # before the executor's own handlers
    ("farm.pipeline.genai", "execute_package"),
    ("farm.pipeline.genai.release", "package_from_snapshot"),
    ("farm.pipeline.genai.release", "assemble"),
    ("farm.pipeline.genai.assembly", "_layout"),
    ("farm.pipeline.genai.assembly", "_materialize"),
    ("farm.pipeline.genai.assembly", "check_folder"),
    ("workers.backends", "check_genai_folder"),
    ("farm.pipeline.genai.twin", "run_twin"),
    ("farm.pipeline.genai.twin_builds", "execute_twin"),     # a part's twin build, after publication
    ("farm.pipeline.genai.twin", "collect_compiled"),  # the twin builds' contexts for the check
    ("farm.pipeline.genai.assembly", "_publish"),
    ("farm.pipeline.genai", "ready_packages"),              # the fan-in
    ("farm.pipeline.accuracy", "after_publish"),
]


TWIN_STAGES = ("run_twin", "execute_twin", "collect_compiled")  # after publication: the twin's own


@pytest.mark.parametrize("module,attr", RAISING_STAGES, ids=[a for _, a in RAISING_STAGES])
def test_a_stage_that_raises_ends_its_build_finishes_the_release_and_frees_the_quota(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, attr: str) -> None:
    """Over POST /v1/genai on the embedded service (FARM_QUOTA_RELEASES=1): whatever stage
    raises, every build ends (failed with a code, or succeeded), the release is done, and the
    token can submit again."""
    import importlib
    import time

    from registry.index import Registry
    from registry.tokens import create_token

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_QUOTA_RELEASES": "1",
                                  "FARM_MAX_ATTEMPTS": "1"})
    reg = Registry.open(settings)
    with reg.db.session() as s:
        submit = create_token(s, "t", "submit")
    reg.close()
    export = make_export(tmp_path / "export")
    files = [{"name": p.name, "digest": sha256_file(p)[0], "size": p.stat().st_size} for p in sorted(export.iterdir())]
    owner: Any = importlib.import_module(module)
    name = attr
    if "." in attr:
        cls, name = attr.split(".")
        owner = getattr(owner, cls)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{attr} raised (the test's bug)")

    def release(c: TestClient, body: dict[str, Any]) -> dict[str, Any]:
        r = c.post("/v1/genai", json=body, headers=auth(submit))
        assert r.status_code == 200, r.text
        st = r.json()
        deadline = time.monotonic() + 180
        while not st["done"] and time.monotonic() < deadline:
            st = c.get(f"/v1/releases/{st['release']}?wait=5", headers=auth(submit)).json()
        return dict(st)

    with TestClient(create_app(settings)) as c:
        for f in files:
            assert c.put(f"/v1/blobs/{f['digest']}", content=(export / f["name"]).read_bytes(),
                         headers=auth(submit)).status_code == 200
        monkeypatch.setattr(owner, name, boom)
        st = release(c, {"files": files, "targets": ["qnn:SM8650"], "name": "llm/r", "tag": "t"})
        assert st["done"], st
        assert all(b["state"] in ("succeeded", "failed") for b in st["builds"]), st
        failed = [b for b in st["builds"] if b["state"] == "failed"]
        assert all(b["error_code"] and b["error_message"] for b in failed), failed
        after_publication = ("after_publish", *TWIN_STAGES)
        if attr not in after_publication:  # those raise after publication: the builds are sound
            assert failed and failed[-1]["error_code"] == "internal-error", st
        if attr in TWIN_STAGES:  # the package is published; its twin is recorded with what it raised
            assert not failed, st
            from registry.models import Artifact

            reg = Registry.open(settings)
            deadline = time.monotonic() + 120  # the twin follows publication: its builds first
            try:
                while True:
                    with reg.db.session() as s:
                        tw = next(t for a in s.query(Artifact).all() if (t := (a.description or {}).get("twin")))
                    if tw["status"] != "pending" or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            finally:
                reg.close()
            assert tw["status"] == "unverified" and f"{attr} raised" in tw["detail"], tw
        # The quota is free: the token's next release is taken (and ends as well).
        again = release(c, {"files": files, "targets": ["qnn:SM8650"]})
        assert again["done"], again
