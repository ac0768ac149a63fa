"""POST /v1/groups in-process (FastAPI TestClient) on the embedded registry, a real QNN compile
behind it: members uploaded as models, named as a group (the CLI's digest), released, resolved
as unverified; hostile bodies refused with documented codes and nothing written."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.core.groups import inspect_group
from farm.core.settings import Settings
from registry.index import Registry
from registry.tokens import create_token
from tests.common.groups import prefill_decode
from tests.common.registry_state import snapshot


@pytest.fixture
def service(tmp_path: Path) -> Iterator[dict[str, Any]]:
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tokens = {scope: create_token(s, f"t-{scope}", scope) for scope in ("read", "submit")}
    reg.close()
    with TestClient(create_app(settings)) as client:
        yield {"client": client, "settings": settings, "tokens": tokens}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_group_over_the_service(service: dict[str, Any], tmp_path: Path) -> None:
    c, submit, read = service["client"], service["tokens"]["submit"], service["tokens"]["read"]
    prefill, decode = prefill_decode(tmp_path)
    digests = {}
    for name, path in (("prefill", prefill), ("decode", decode)):
        r = c.post("/v1/models", content=path.read_bytes(), headers=auth(submit))
        assert r.status_code == 200, r.text
        digests[name] = r.json()["digest"]
    body = {"graphs": [{"name": "prefill", "model": digests["prefill"]}, {"name": "decode", "model": digests["decode"]}],
            "name": "llm/tiny", "tag": "t1"}
    assert c.post("/v1/groups", json=body, headers=auth(read)).status_code == 403
    r = c.post("/v1/groups", json=body, headers=auth(submit))
    assert r.status_code == 200, r.text
    group = r.json()
    assert group["digest"] == inspect_group([("prefill", str(prefill)), ("decode", str(decode))]).digest
    assert c.post("/v1/groups", json=body, headers=auth(submit)).json()["digest"] == group["digest"]

    refused = c.post("/v1/releases", json={"model": "llm/tiny:t1", "targets": ["qnn:SM8450"]}, headers=auth(submit))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "sharing-unsupported"
    rel = c.post("/v1/releases", json={"model": "llm/tiny:t1", "targets": ["qnn:SM8650"]}, headers=auth(submit))
    assert rel.status_code == 200, rel.text
    deadline = time.monotonic() + 120
    st = rel.json()
    while not st["done"] and time.monotonic() < deadline:
        st = c.get(f"/v1/releases/{st['release']}?wait=5", headers=auth(read)).json()
    assert st["ok"], st
    res = c.get("/v1/resolve?model=llm/tiny:t1&soc=SM8650&qnn=2.51.0", headers=auth(read)).json()
    assert res["verdict"] == "unverified" and "weight-shared" in res["unverified"]
    assert sorted(f["name"] for f in res["files"]) == ["g0_ctx.onnx", "g0_ctx_qnn.bin", "g1_ctx.onnx"]


def test_hostile_group_bodies(service: dict[str, Any], tmp_path: Path) -> None:
    c, submit = service["client"], service["tokens"]["submit"]
    prefill, _ = prefill_decode(tmp_path)
    model = c.post("/v1/models", content=prefill.read_bytes(), headers=auth(submit)).json()["digest"]
    group = c.post("/v1/groups", json={"graphs": [{"name": "a", "model": model}, {"name": "b", "model": model}]},
                   headers=auth(submit)).json()["digest"]
    before = snapshot(service["settings"])
    cases = [
        ({"graphs": [{"name": "../x", "model": model}, {"name": "b", "model": model}]}, 400, "bad-group"),
        ({"graphs": [{"name": "a", "model": model}, {"name": "a", "model": model}]}, 400, "bad-group"),
        ({"graphs": [{"name": "a", "model": model}]}, 400, None),
        ({"graphs": [{"name": "a", "model": "sha256:" + "0" * 64}, {"name": "b", "model": model}]}, 404, "not-found"),
        ({"graphs": [{"name": "a", "model": group}, {"name": "b", "model": model}]}, 400, "bad-group"),
        ({"graphs": [{"name": "a", "model": "x" * 400}, {"name": "b", "model": model}]}, 400, None),
        ({"graphs": [{"name": f"g{i}", "model": model} for i in range(65)]}, 400, None),
        ({"graphs": "prefill"}, 400, None),
    ]
    for body, status, code in cases:
        r = c.post("/v1/groups", json=body, headers=auth(submit))
        assert r.status_code == status, (body, r.text)
        if code:
            assert r.json()["error"]["code"] == code, r.text
    assert c.post("/v1/groups", json=cases[0][0]).status_code == 401
    assert snapshot(service["settings"]) == before
