"""A genai package on the distributed farm: `farm submit --genai` sends each part's
group build to the QNN 2.51.0 workers (two of them: the parts build at once), and the worker
that finishes the last part sends the package's build, which a worker assembles, checks and
publishes. One release holds the package's build and its parts'."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.test_farm_cluster import Farm, farm_cluster  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parents[2]


def test_submit_genai_fans_out_to_workers_and_answers_one_folder(farm_cluster: Farm,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    export = tmp_path / "export"
    subprocess.run([sys.executable, str(ROOT / "bench" / "genai_export.py"), str(export), "--parts", "2"],
                   check=True, capture_output=True, timeout=120)
    farm_cluster.start_worker("2.51.0")
    farm_cluster.start_worker("2.51.0")
    got = farm_cluster.cli("submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag", "c",
                           "--wait", "--timeout", "240", "--json", timeout=300)
    doc = json.loads(got.stdout)
    assert doc["ok"] and doc["done"], doc
    builds = {b["build"]: b for b in doc["builds"]}
    assert len(builds) == 3 and all(b["state"] == "succeeded" for b in builds.values())
    # The package's build ran after both parts: its model is the package, the parts' are groups.
    rows = farm_cluster.builds()
    package = max(rows, key=lambda r: r["id"])
    assert package["id"] in builds

    dest = tmp_path / "device"
    fetched = json.loads(farm_cluster.cli("fetch", "--model", "llm/tiny:c", "--soc", "SM8650", "--qnn", "2.51.0",
                                          "--dest", str(dest), "--json").stdout)
    assert fetched["ctx_model"] == str(dest / "genai_config.json")
    assert sorted(p.name for p in dest.glob("*.bin")) == ["context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin"]
    # --wait answered at publication; the worker that published it runs the twin right after.
    deadline = time.monotonic() + 240
    while True:
        res = json.loads(farm_cluster.cli("resolve", "--model", "llm/tiny:c", "--soc", "SM8650", "--qnn", "2.51.0",
                                          "--json").stdout)
        if res["twin"]["status"] != "pending" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert res["twin"]["status"] == "ok" and res["twin"]["tokens_matched"] == res["twin"]["tokens_compared"]
    # The twin ran on its parts' twin builds (sent at submission, compiled by the workers as
    # builds of their own), nothing compiled in the check itself; no twin build is a build.
    twins = _twin_rows(farm_cluster)
    assert res["twin"]["compiled"] == "given" and sorted(res["twin"]["twin_builds"]["builds"]) == sorted(twins)
    assert len(twins) == 2 and all(t["state"] == "succeeded" and t["options"]["twin"] for t in twins.values())
    assert len(farm_cluster.builds()) == 3

    # Submitted again: every build answered from the index, shown as cached, nothing sent.
    again = farm_cluster.cli("submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag",
                             "c", "--wait")
    assert again.stdout.count("cached") == 3 and "succeeded" not in again.stdout, again.stdout
    assert _twin_rows(farm_cluster) == twins  # no twin build queued or run again


def _twin_rows(farm: Farm) -> dict[int, dict[str, object]]:
    """The farm's twin builds by id: state, attempts, options, when they finished, their SoC."""
    from sqlalchemy import select

    from registry.models import TwinBuild

    reg = farm.db()
    try:
        with reg.db.session() as s:
            return {t.id: {"state": t.state, "attempts": t.attempts, "options": dict(t.options),
                           "finished_at": t.finished_at, "target": t.target} for t in s.scalars(select(TwinBuild))}
    finally:
        reg.close()


def _settled_twin(farm: Farm, ref: str, soc: str) -> dict[str, object]:
    """REF's twin for SOC once it is no longer pending (the worker runs it after publication)."""
    deadline = time.monotonic() + 240
    while True:
        res = json.loads(farm.cli("resolve", "--model", ref, "--soc", soc, "--qnn", "2.51.0", "--json").stdout)
        if res["twin"]["status"] != "pending" or time.monotonic() > deadline:
            return dict(res["twin"])
        time.sleep(0.5)


def test_a_second_soc_of_one_htp_arch_sends_no_twin_build(farm_cluster: Farm, tmp_path: Path) -> None:  # noqa: F811
    """SM8550 and SC8380XP are both HTP v73: the second submission queues and sends no twin
    build, and its worker's twin runs on the twin builds compiled for SM8550."""
    from tests.common.genai import make_export

    export = make_export(tmp_path / "export")
    farm_cluster.start_worker("2.51.0")
    for soc in ("SM8550", "SC8380XP"):
        got = farm_cluster.cli("submit", "--genai", str(export), "-t", f"qnn:{soc}", "--name", "llm/v73", "--tag",
                               "c", "--wait", "--timeout", "240", "--json", timeout=300)
        assert json.loads(got.stdout)["ok"], got.stdout
        tw = _settled_twin(farm_cluster, "llm/v73:c", soc)
        assert tw["status"] == "ok" and tw["compiled"] == "given", tw
        twins = _twin_rows(farm_cluster)
        if soc == "SM8550":
            first = twins
        assert twins == first and len(twins) == 2 and all(t["target"] == "SM8550" for t in twins.values()), twins
        assert sorted(tw["twin_builds"]["builds"]) == sorted(first)  # type: ignore[index]


def test_cancel_mid_package_leaves_the_registry_consistent(farm_cluster: Farm, tmp_path: Path) -> None:  # noqa: F811
    """`farm cancel RELEASE` while the parts compile: every build of the package's release is
    final (cancelled, or done before the cancel), and its twin builds too; the package publishes
    nothing, and the next submit builds it (a cancel is not a verdict)."""
    export = tmp_path / "export"
    subprocess.run([sys.executable, str(ROOT / "bench" / "genai_export.py"), str(export), "--parts", "2"],
                   check=True, capture_output=True, timeout=120)
    farm_cluster.start_worker("2.51.0")
    st = json.loads(farm_cluster.cli("submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/cx",
                                     "--json").stdout)
    farm_cluster.cli("cancel", str(st["release"]))
    done = json.loads(farm_cluster.cli("status", str(st["release"]), "--json", check=False).stdout)
    assert done["done"], done
    package = max(b["build"] for b in done["builds"])
    (pkg,) = [b for b in done["builds"] if b["build"] == package]
    assert pkg["state"] == "failed" and pkg["error_code"] == "cancelled" and pkg["artifact"] is None
    # Nothing is left running once the workers have seen the cancel; no artifact for the package.
    rows = farm_cluster.wait_builds(lambda rows: all(r["state"] in ("succeeded", "failed") for r in rows))
    assert [r for r in rows if r["id"] == package][0]["code"] == "cancelled"
    # The package's twin builds (sent at submit) went with it: none left to run.
    twins = _twin_rows(farm_cluster)
    assert len(twins) == 2 and all(t["state"] in ("succeeded", "failed") for t in twins.values()), twins
    again = json.loads(farm_cluster.cli("submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/cx",
                                        "--wait", "--timeout", "240", "--json", timeout=300).stdout)
    assert again["ok"], again


def test_submit_genai_over_http_on_the_cluster(farm_cluster: Farm, tmp_path: Path) -> None:  # noqa: F811
    """`farm submit --genai DIR --server URL` against `farm serve` with a broker: the service lays
    the export out from the blobs it was sent and queues the parts to the workers; the worker that
    finishes the last part sends the package's build. A second submit sends nothing."""
    from tests.common.genai import make_export

    f = farm_cluster
    export = make_export(tmp_path / "export")
    f.start_worker("2.51.0")
    with f.over_http(tmp_path) as h:
        url, submit, read, cli = h.url, h.submit, h.read, h.cli
        args = ("submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/h", "--tag", "c", "--wait",
                "--timeout", "240", "--server", url, "--token", submit, "--json")
        doc = json.loads(cli(*args).stdout)
        assert doc["ok"] and len(doc["builds"]) == 3 and doc["uploaded_bytes"] > 0, doc
        dest = tmp_path / "device"
        got = json.loads(cli("install", "--server", url, "--token", read, "--model", "llm/h:c", "--soc", "SM8650",
                             "--qnn", "2.51.0", "--dest", str(dest), "--json").stdout)
        assert Path(got["ctx_model"]).name == "genai_config.json"
        assert sorted(p.name for p in dest.glob("*.bin")) == ["context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin"]
        again = json.loads(cli(*args).stdout)
        assert again["uploaded_bytes"] == 0 and again["ok"]
        assert sorted(b["build"] for b in again["builds"]) == sorted(b["build"] for b in doc["builds"])


def test_an_sdk_whose_workers_cannot_make_the_package_is_left_out_before_anything_compiles(
        farm_cluster: Farm, tmp_path: Path) -> None:  # noqa: F811
    """Workers of QNN 2.47.0 (no onnxruntime-genai: none installs beside its onnxruntime 1.24.4)
    and 2.51.0: `farm workers` says what each makes; `farm submit --genai` with no --sdk builds
    for 2.51.0 only (no part either for 2.47.0), says so in one warning line, and exits 0 with no
    failed build; a re-submit creates no build; naming 2.47.0 is refused up front. The package
    is then refused by `farm package` and over HTTP (POST/GET /v1/packages, `farm install
    --package`) with package-unsupported, never a 5xx."""
    import urllib.error
    import urllib.request

    from tests.common.genai import make_export

    f = farm_cluster
    export = make_export(tmp_path / "export")
    f.start_worker("2.47.0")
    f.start_worker("2.51.0")
    shown = {w["toolchain"]: w for w in json.loads(f.cli("workers", "--json").stdout)}
    assert shown["2.47.0"]["makes"] == [] and "onnxruntime_genai" in shown["2.47.0"]["lacks"]["genai-package"]
    assert set(shown["2.51.0"]["makes"]) == {"genai-package", "genai-folder-check", "genai-twin", "ort-model-package"}
    assert "compile.qnn.2.51.0.genai" in shown["2.51.0"]["queues"]
    human = f.cli("workers").stdout
    assert "genai,folder-check,twin,ort-package" in human and "QNN 2.47.0 makes no genai package" in human

    args = ("submit", "--genai", str(export), "-t", "qnn:SM8650", "--name", "llm/fleet", "--tag", "t", "--wait",
            "--timeout", "240", "--json")
    got = f.cli(*args, timeout=300)
    doc = json.loads(got.stdout)
    warnings = [line for line in got.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "QNN 2.47.0" in warnings[0] and "QNN 2.51.0" in warnings[0], got.stderr
    assert doc["ok"] and len(doc["builds"]) == 3, doc
    rows = f.builds()
    assert {r["toolchain"] for r in rows} == {"2.51.0"} and all(r["state"] == "succeeded" for r in rows), rows

    again = f.cli(*args, timeout=300)
    assert json.loads(again.stdout)["ok"] and len(f.builds()) == len(rows)
    named = f.cli(*args[:-3], "--sdk", "2.47.0", check=False)
    assert named.returncode == 2 and "error[capability-missing]" in named.stderr and "QNN 2.51.0" in named.stderr
    assert len(f.builds()) == len(rows)

    local = f.cli("package", "llm/fleet:t", "-d", str(tmp_path / "pkg"), check=False)
    assert local.returncode == 1 and "error[package-unsupported]" in local.stderr and "bug" not in local.stderr
    with f.over_http(tmp_path) as h:
        for method, path, token, body in (("POST", "/v1/packages", h.submit, b'{"ref": "llm/fleet:t"}'),
                                          ("GET", "/v1/packages?ref=llm/fleet:t", h.read, None)):
            req = urllib.request.Request(h.url + path, data=body, method=method,
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=60)
                raise AssertionError(f"{method} {path} answered 2xx")
            except urllib.error.HTTPError as e:
                answer = json.loads(e.read())
                assert e.code == 409 and answer["error"]["code"] == "package-unsupported", (e.code, answer)
        device = subprocess.run([sys.executable, "-m", "farm.cli", "install", "--package", "llm/fleet:t", "--server",
                                 h.url, "--token", h.read, "-d", str(tmp_path / "device")], env=h.env,
                                capture_output=True, text=True, timeout=120)
        assert device.returncode == 1 and "error[package-unsupported]" in device.stderr, device.stderr
        assert "farm install --model llm/fleet:t" in device.stderr
