"""GET /v1/coverage/summary and /v1/coverage/models through the service: the same queries as
`farm coverage --summary/--missing`, filters and cursors checked, bad ones refused with a code."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.core.settings import Settings
from registry.index import Registry
from registry.tokens import create_token
from tests.common import coverage_scenario


@pytest.fixture
def client(tmp_path) -> Iterator[TestClient]:
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    reg = Registry.open(settings)
    coverage_scenario.run(reg.db.session)
    with reg.db.session() as s:
        token = create_token(s, "reader", "read")
    reg.close()
    with TestClient(create_app(settings)) as c:
        c.headers["Authorization"] = f"Bearer {token}"
        c.farm_home = str(tmp_path / "home")  # type: ignore[attr-defined]
        yield c


def test_summary_and_pages(client: TestClient) -> None:
    r = client.get("/v1/coverage/summary")
    assert r.status_code == 200, r.text
    rows = {(x["target"], x["toolchain"]): x for x in r.json()["rows"]}
    assert rows[("qnn:SM8750", "2.51.0")] | {} == {
        "backend": "qnn", "target": "qnn:SM8750", "toolchain": "2.51.0", "models": 3, "built": 1, "building": 0,
        "broken": 1, "failed": 1, "missing": 0, "probe_verified": 0, "device_verified": 0}
    assert r.json()["source"] == "counters"
    assert client.get("/v1/coverage/summary?tag=stable").json()["source"] == "counters"
    assert client.get("/v1/coverage/summary?prefix=al").json()["source"] == "cells"
    names, cursor = [], None
    while True:
        page = client.get("/v1/coverage/models", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        names += [m["name"] for m in page.json()["models"]]
        cursor = page.json()["next"]
        if not cursor:
            break
    assert names == ["alpha", "beta", "gamma"]
    missing = client.get("/v1/coverage/models?state=missing").json()["models"]
    assert [(m["name"], m["missing"]) for m in missing][1] == (
        "beta", [{"target": "qnn:SM8750", "toolchain": "2.51.0", "state": "failed(compile-timeout)"}])


@pytest.mark.parametrize("query", ["cursor=AAAA", "state=exploded", "limit=0", "limit=100000", "tag=%20",
                                   "target=SM8650", "model=nosuch:tag", "prefix=" + "a" * 300, "backend=cuda"])
def test_bad_filters_are_errors_with_codes(client: TestClient, query: str) -> None:
    r = client.get(f"/v1/coverage/models?{query}")
    assert 400 <= r.status_code < 500, (query, r.status_code)
    assert r.json()["error"]["code"] in ("usage", "not-found"), r.json()


def test_page_summary_first_legend_visible_verdicts_paged(client: TestClient) -> None:
    r = client.get("/coverage")
    assert r.status_code == 200, r.text
    page = r.text
    assert page.index("<h2>Summary</h2>") < page.index("<h2>Legend</h2>") < page.index("<h2>Models</h2>")
    # alpha's SM8650 2.51.0 cell: verdicts per runtime written out, not in a tooltip.
    assert "QNN 2.51.0 fails</div><div class='v'>QNN 2.52.0 loads</div>" in page
    assert "title=" not in page
    assert "failed (compile-timeout)" in page
    # Summary counts link to their drill-down, with the filters and never a token.
    assert "?soc=qnn%3ASM8750&amp;sdk=2.51.0&amp;state=failed" in page
    assert "token" not in page.lower().replace("no token", "")
    paged = client.get("/coverage", params={"prefix": "", "tag": "", "state": ""})  # an empty form
    assert paged.status_code == 200 and paged.text.count("<table class='model'") == 3
    narrow = client.get("/coverage", params={"state": "failed", "soc": "SM8750"}).text
    assert narrow.count("<table class='model'") == 1 and "beta" not in narrow.split("<h2>Models")[0]
    assert client.get("/coverage", params={"cursor": "bad!"}).status_code == 400


def test_cli_summary_and_missing_are_the_service_rows(client: TestClient) -> None:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "FARM_HOME": client.farm_home}  # type: ignore[attr-defined]
    env.pop("FARM_SERVER", None)
    env.pop("FARM_DATABASE_URL", None)

    def farm(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "farm.cli", "coverage", *argv], env=env, capture_output=True,
                              text=True, timeout=120)

    out = farm("--summary", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == client.get("/v1/coverage/summary").json()
    assert "SM8750" in farm("--summary").stdout
    out = farm("--missing", "--json")
    assert out.returncode == 1, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["tags"], r["target"], r["state"]) for r in rows] == [
        (["alpha:stable"], "qnn:SM8750", "broken"), (["beta:stable"], "qnn:SM8750", "failed(compile-timeout)")]
    out = farm("--missing", "--json", "--tag", "dev", "-t", "qnn:SM8650", "-t", "qnn:SM8750")
    # gamma: queued on SM8650 (building is not missing), built on SM8750.
    assert (out.returncode, json.loads(out.stdout)) == (0, []), out.stderr


def test_multi_soc_build_is_each_socs_cell_everywhere(tmp_path) -> None:
    """A model built only as one SM8650+SM8750 binary: `farm coverage --missing` lists neither SoC,
    the whole matrix, /v1/coverage/models and the page show it in both SoCs' cells (via), never as
    a target of its own."""
    import json
    import os
    import subprocess
    import sys

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    reg = Registry.open(settings)
    digest = coverage_scenario.run_multi_soc(reg.db.session)
    with reg.db.session() as s:
        token = create_token(s, "reader", "read")
    reg.close()
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home")}
    env.pop("FARM_SERVER", None)
    env.pop("FARM_DATABASE_URL", None)

    def farm(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "farm.cli", "coverage", *argv], env=env, capture_output=True,
                              text=True, timeout=120)

    for wanted in ([], ["-t", "qnn:SM8650"], ["-t", "qnn:SM8650+SM8750"]):
        out = farm("--missing", "--json", *wanted)
        assert (out.returncode, json.loads(out.stdout or "null")) == (0, []), (wanted, out.stdout, out.stderr)
    out = farm("--missing", "--json", "-t", "qnn:SM8550")
    assert out.returncode == 1 and [r["target"] for r in json.loads(out.stdout)] == ["qnn:SM8550"], out.stdout
    out = farm("--json")
    assert out.returncode == 0, out.stderr
    cells = {c["target"]: c for c in json.loads(out.stdout)["cells"] if c["model"] == digest}
    assert set(cells) == {"qnn:SM8650", "qnn:SM8750"}
    assert all(c["state"] == "built" and c["via"] == ["qnn:SM8650+SM8750"] for c in cells.values())
    with TestClient(create_app(settings)) as c:
        c.headers["Authorization"] = f"Bearer {token}"
        matrix = c.get("/v1/coverage").json()
        assert {x["target"] for x in matrix["cells"]} == {"qnn:SM8650", "qnn:SM8750"}
        [model] = c.get("/v1/coverage/models").json()["models"]
        assert {x["target"]: x["via"] for x in model["cells"]} == {"qnn:SM8650": ["qnn:SM8650+SM8750"],
                                                                   "qnn:SM8750": ["qnn:SM8650+SM8750"]}
        rows = c.get("/v1/coverage/summary").json()["rows"]
        assert sorted((r["target"], r["built"], r["missing"]) for r in rows) == [
            ("qnn:SM8650", 1, 0), ("qnn:SM8750", 1, 0)]
        html = c.get("/coverage?prefix=delta").text
        assert "SM8650+SM8750</th>" not in html and "built unverified via SM8650+SM8750" in html
