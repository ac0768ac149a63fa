"""ORT model packages end to end (docs/packages.md), real compiles: a small model with external data built
for SM8650 and SM8750 (QNN 2.51.0) becomes, through `farm package`, a folder that onnxruntime
1.32's ModelPackageContext opens: two QNN variants with their builds' compatibility strings and
a CPU variant, which CPU-only session options select and which runs (the source model's
outputs). A second `farm package` is answered from the index; a new build makes a new package;
missing store files and unknown refs fail with their codes, nothing published. Over HTTP too."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.integration.test_farm_cluster import farm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

ort = pytest.importorskip("onnxruntime")
if not hasattr(ort, "ModelPackageContext"):
    pytest.skip("ORT model packages need onnxruntime >= 1.32", allow_module_level=True)


def matmul_model(path: Path, seed: int = 7) -> None:
    """A 64x64 MatMul with seeded weights as external data (weights.bin beside it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(seed).random((64, 64), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "FARM_HOME": str(tmp_path / "home"), "PYTHONPATH": root}


def package(env: dict[str, str], *args: str, check: bool = True) -> Any:
    proc = farm(env, "package", *args, "--json", check=check)
    return proc if not check else json.loads(proc.stdout)


def test_sm8650_and_sm8750_build_gives_a_package_ort_opens_and_runs_on_cpu(env: dict[str, str], tmp_path: Path):
    model = tmp_path / "src" / "mm.onnx"
    model.parent.mkdir()
    matmul_model(model)
    farm(env, "build", str(model), "-t", "qnn:SM8650", "-t", "qnn:SM8750", "--name", "mynet", "--tag", "stable")

    dest = tmp_path / "pkg"
    first = package(env, "mynet:stable", "-d", str(dest))
    assert first["cached"] is False and first["path"] == str(dest)
    [comp] = first["components"]
    qnn = [v for v in comp["variants"] if v["ep"] == "QNNExecutionProvider"]
    assert sorted(v["target"] for v in qnn) == ["qnn:SM8650", "qnn:SM8750"]
    # Each QNN variant carries its own build's compatibility string (its SoC id: 57, 69).
    by_target = {v["target"]: v["compatibility_string"] for v in qnn}
    assert by_target["qnn:SM8650"].startswith("v2:") and ":57:" in by_target["qnn:SM8650"]
    assert ":69:" in by_target["qnn:SM8750"]
    for v in qnn:  # the string the index recorded for the build (farm show)
        shown = json.loads(farm(env, "show", v["artifact"][7:19], "--json").stdout)
        assert shown["compatibility"]["QNNExecutionProvider"] == v["compatibility_string"]

    # ORT's own API opens the folder: one component, two QNN variants and a CPU variant.
    ctx = ort.ModelPackageContext(str(dest))
    assert ctx.get_component_names() == ["model"]
    eps = sorted(ctx.get_variant_ep_name("model", v) for v in ctx.get_variant_names("model"))
    assert eps == ["CPUExecutionProvider", "QNNExecutionProvider", "QNNExecutionProvider"]
    # CPU-only session options: ORT selects the CPU variant, and it runs the source model.
    chosen = ctx.select_component("model", ort.ModelPackageOptions(ort.SessionOptions()))
    assert chosen.get_selected_variant_name() == "cpu"
    x = np.random.default_rng(1).random((1, 64), dtype=np.float32)
    got = chosen.create_session().run(None, {"x": x})[0]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(got, want)
    # The weights are a shared asset, stored once; the package lists every file it holds.
    assets = [p for p in (dest / "shared_assets").iterdir()]
    assert len(assets) == 1 and (assets[0] / "weights.bin").read_bytes() == (model.parent / "weights.bin").read_bytes()
    assert ort.ModelPackage.compute_directory_hash(str(assets[0])) == "sha256:" + assets[0].name[7:]
    listed = {f["path"] for f in first["files"]}
    on_disk = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert listed == on_disk
    # The evidence says what was checked and what could not be (QNN selection needs an NPU).
    ev = first["evidence"]
    assert ev["onnxruntime"].startswith("1.32") and len(ev["checked"]) == 3
    assert ev["components"][0]["selected"] == "cpu" and ev["components"][0]["outputs"][0]["shape"] == [1, 64]
    assert all("needs an NPU" in v["unchecked"] for v in ev["variants"] if v["ep"] == "QNNExecutionProvider")

    # Nothing new published: answered from the index, the same package.
    again = package(env, "mynet:stable")
    assert again["cached"] is True and again["digest"] == first["digest"]
    # A new build of the model: a new package, with its variant.
    farm(env, "build", str(model), "-t", "qnn:SM8550", "--name", "mynet", "--tag", "stable")
    third = package(env, "mynet:stable", "-d", str(dest))
    assert third["cached"] is False and third["digest"] != first["digest"]
    assert sorted(v["target"] for v in third["components"][0]["variants"] if "target" in v) == [
        "qnn:SM8550", "qnn:SM8650", "qnn:SM8750"]
    assert len(ort.ModelPackageContext(str(dest)).get_variant_names("model")) == 4  # swapped in whole

    # Bad refs: their codes, no traceback.
    for ref, code, rc in (("nosuch:tag", "not-found", 1), ("Bad Name", "bad-name", 2), ("sha256:abc", "usage", 2)):
        proc = package(env, ref, check=False)
        assert proc.returncode == rc, proc.stderr
        assert json.loads(proc.stdout)["error"]["code"] == code and "Traceback" not in proc.stderr


def test_missing_store_files_and_no_builds_fail_with_their_codes(env: dict[str, str], tmp_path: Path):
    from registry.index import Registry
    from registry.models import ModelPackageRow

    model = tmp_path / "mm.onnx"
    matmul_model(model)
    farm(env, "build", str(model), "-t", "qnn:SM8650", "--name", "gone", "--tag", "t1")
    # A model with no build at all (a failed one publishes nothing): no-published-builds.
    bad = tmp_path / "strings.onnx"
    _identity_on_strings(bad)
    farm(env, "build", str(bad), "-t", "qnn:SM8650", "--name", "nobuild", "--tag", "t1", check=False)
    proc = package(env, "nobuild:t1", check=False)
    assert proc.returncode == 3 and json.loads(proc.stdout)["error"]["code"] == "no-published-builds"

    settings = Settings.from_env({"FARM_HOME": env["FARM_HOME"]})
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            from sqlalchemy import select

            from registry.models import Artifact, ArtifactFile

            blob = s.scalar(select(ArtifactFile.digest).join(Artifact).where(ArtifactFile.role == "context"))
        reg.store.delete(blob)
        proc = package(env, "gone:t1", "-d", str(tmp_path / "out"), check=False)
        assert proc.returncode == 1, proc.stderr
        assert json.loads(proc.stdout)["error"]["code"] == "package-files-missing"
        assert not (tmp_path / "out").exists()
        with reg.db.session() as s:
            assert s.scalar(select(ModelPackageRow.id)) is None  # nothing published
    finally:
        reg.close()


def _identity_on_strings(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.STRING, [1])
    y = helper.make_tensor_value_info("y", TensorProto.STRING, [1])
    m = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "s", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))


def test_package_over_http_signed_and_farm_install_package(env: dict[str, str], tmp_path: Path):
    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from registry.signing import create_key
    from tests.common.inproc import running_service
    from tests.common.schemas import valid as validate
    from tests.common.service import token

    pub, other = create_key(tmp_path / "release.key"), create_key(tmp_path / "other.key")
    model = tmp_path / "mm.onnx"
    matmul_model(model)
    farm(env, "build", str(model), "-t", "qnn:SM8650", "--name", "web", "--tag", "v1")
    settings = Settings.from_env({"FARM_HOME": env["FARM_HOME"], "FARM_SIGNING_KEY": str(tmp_path / "release.key")})
    read = token(settings, "r", "read")
    with running_service(settings) as svc:
        remote = {**env, "FARM_SERVER": svc["url"], "FARM_TOKEN": read, "FARM_TRUSTED_KEYS": pub}
        # A device (read token) can't make a package, nor install one not made yet.
        proc = farm(remote, "package", "web:v1", "--json", check=False)
        assert proc.returncode == 1 and json.loads(proc.stdout)["error"]["code"] == "forbidden"
        proc = farm(remote, "install", "--package", "web:v1", "-d", str(tmp_path / "early"), "--json", check=False)
        assert json.loads(proc.stdout)["error"]["code"] == "not-found" and "farm package web:v1" in proc.stderr
        # The pipeline (submit token) makes it: signed with the service's key, placed by digest.
        dest = tmp_path / "remote-pkg"
        made = json.loads(farm({**remote, "FARM_TOKEN": svc["token"]}, "package", "web:v1", "-d", str(dest),
                               "--json").stdout)
        assert made["path"] == str(dest) and len(made["signatures"]) == 1
        validate("package", made)
        # The device installs it with its read token, the signature checked against its trusted key.
        dev = tmp_path / "device-pkg"
        got = json.loads(farm(remote, "install", "--package", "web:v1", "-d", str(dev), "--json").stdout)
        validate("install", got)
        assert got["artifact"] == made["digest"] and got["ctx_model"] == str(dev / "manifest.json") and got["signed_by"]
        chosen = ort.ModelPackageContext(str(dev)).select_component(
            "model", ort.ModelPackageOptions(ort.SessionOptions()))
        assert chosen.get_selected_variant_name() == "cpu"
        assert got["downloaded_bytes"] > 0 and got["reused_bytes"] == 0
        # Installed again over itself (one connection): every file verified where it is, not a byte
        # fetched, nothing moved (the same inodes); a file changed there is fetched again.
        inodes = {p: p.stat().st_ino for p in dev.rglob("*") if p.is_file()}
        again = json.loads(farm(remote, "install", "--package", "web:v1", "-d", str(dev), "--connections", "1",
                                "--json").stdout)
        assert (again["downloaded_bytes"], again["reused_bytes"]) == (0, got["bytes"])
        assert {p: p.stat().st_ino for p in dev.rglob("*") if p.is_file()} == inodes
        (dev / "manifest.json").write_bytes(b"{}" + b" " * ((dev / "manifest.json").stat().st_size - 2))
        fixed = json.loads(farm(remote, "install", "--package", "web:v1", "-d", str(dev), "--json").stdout)
        assert 0 < fixed["downloaded_bytes"] < got["bytes"]
        assert ort.ModelPackageContext(str(dev)).select_component(
            "model", ort.ModelPackageOptions(ort.SessionOptions())).get_selected_variant_name() == "cpu"
        # Signed by a key this device does not trust: refused, nothing placed.
        proc = farm({**remote, "FARM_TRUSTED_KEYS": other}, "install", "--package", "web:v1", "-d",
                    str(tmp_path / "untrusted"), "--json", check=False)
        assert json.loads(proc.stdout)["error"]["code"] == "signature-invalid"
        assert not (tmp_path / "untrusted").exists()
        proc = farm(remote, "install", "--package", "web:v1", "--model", "web:v1", "-d", str(dev), check=False)
        assert proc.returncode == 2 and "error[usage]" in proc.stderr
    with TestClient(create_app(settings)) as c:
        r = c.get(f"/v1/packages/{made['digest']}", headers={"Authorization": f"Bearer {read}"})
        assert r.status_code == 200 and r.json()["digest"] == made["digest"] and r.json()["cached"] is True
        submit = {"Authorization": f"Bearer {svc['token']}"}
        r = c.post("/v1/packages", json={"ref": "nosuch:v1"}, headers=submit)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not-found"
        for hostile, code in (("../../etc/passwd", "bad-name"), ("sha256:" + "0" * 64, "usage"), ("x" * 401, "usage")):
            r = c.post("/v1/packages", json={"ref": hostile}, headers=submit)
            assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
        r = c.get("/v1/packages/sha256:" + "0" * 64, headers={"Authorization": f"Bearer {read}"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not-found"
        assert c.get("/v1/packages/..%2F..%2Fetc", headers={"Authorization": f"Bearer {read}"}).status_code in (400, 404)
        assert {"/v1/packages", "/v1/packages/{digest}"} <= set(c.get("/openapi.json").json()["paths"])


def test_a_graph_group_is_a_component_per_graph_sharing_weights_and_binaries(env: dict[str, str], tmp_path: Path):
    from tests.common.groups import prefill_decode

    prefill, decode = prefill_decode(tmp_path / "src", external=True)
    farm(env, "build", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650",
         "--name", "llm/tiny", "--tag", "t1")
    dest = tmp_path / "pkg"
    got = package(env, "llm/tiny:t1", "-d", str(dest))
    assert [c["name"] for c in got["components"]] == ["prefill", "decode"]
    ctx = ort.ModelPackageContext(str(dest))
    assert sorted(ctx.get_component_names()) == ["decode", "prefill"]
    # Two shared assets: the weights both graphs read (stored once, though each graph's bundle
    # has its own copy), and the group build (both _ctx.onnx and the one binary they share).
    assets = sorted((dest / "shared_assets").iterdir())
    assert len(assets) == 2
    held = sorted(p.name for a in assets for p in a.iterdir())
    assert held == ["g0_ctx.onnx", "g0_ctx_qnn.bin", "g1_ctx.onnx", "weights.data"]
    manifest = json.loads((dest / "manifest.json").read_text())
    for name, i in (("prefill", 0), ("decode", 1)):
        qnn = manifest["components"][name]["variants"]["qnn-SM8650-2.51.0"]
        assert qnn["executor_info"]["ort"]["model_file"].endswith(f"/g{i}_ctx.onnx")
        assert qnn["executor_info"]["ort"]["session_options"] == {"ep.share_ep_contexts": "1"}
        chosen = ctx.select_component(name, ort.ModelPackageOptions(ort.SessionOptions()))
        assert chosen.get_selected_variant_name() == "cpu"
        seq = 16 if name == "prefill" else 1
        x = np.ones((1, seq, 64), np.float32)
        y = chosen.create_session().run(None, {"x": x, "bias": x})[0]
        assert y.shape == (1, seq, 64) and np.isfinite(y).all()


def test_a_package_that_fails_its_check_is_package_verify_failed(tmp_path: Path):
    """The child's checks really check: a variant file whose bytes are not its digest's, an
    asset file likewise, and a CPU variant that does not run each fail with their check named."""
    import hashlib

    from farm.core import packages as pk
    from farm.core.errors import PackageVerifyError
    from workers.ortpackage import author

    model = tmp_path / "src" / "mm.onnx"
    model.parent.mkdir()
    matmul_model(model)

    def entry(path: Path, name: str) -> dict[str, Any]:
        data = path.read_bytes()
        return {"path": name, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}

    def run(case: str, files: dict[str, bytes], model_files: list[dict[str, Any]]) -> PackageVerifyError:
        work = tmp_path / case
        (work / "blobs").mkdir(parents=True)
        for digest, data in files.items():
            (work / "blobs" / digest[7:]).write_bytes(data)
        ctx = pk.PackageFile("model_ctx.onnx", "sha256:" + hashlib.sha256(b"ctx").hexdigest(), 3)
        build = pk.Build("sha256:" + "1" * 64, "qnn", "SM8650", "2.51.0", "sha256:" + "0" * 64, ctx.path, (ctx,),
                         None, "v2:x", {"soc_model": "57"})
        files.setdefault(ctx.digest, b"ctx")
        (work / "blobs" / ctx.digest[7:]).write_bytes(files[ctx.digest])
        layout = pk.plan(package_name="m", package_version="t", model="sha256:" + "a" * 64, model_files=model_files,
                         group=None, builds=[build])
        (work / "child").mkdir()
        with pytest.raises(PackageVerifyError) as e:
            author({**layout.to_request(), "root": str(work / "package"), "blobs": str(work / "blobs"),
                    "sample": None}, work / "child", timeout=120)
        assert e.value.code == "package-verify-failed"
        return e.value

    onnx_e, data_e = entry(model, "model.onnx"), entry(model.parent / "weights.bin", "weights.bin")
    good = {onnx_e["digest"]: model.read_bytes(), data_e["digest"]: (model.parent / "weights.bin").read_bytes()}
    ctx_digest = "sha256:" + hashlib.sha256(b"ctx").hexdigest()
    err = run("variant-file", {**good, ctx_digest: b"CTX"}, [onnx_e, data_e])
    assert "(files)" in err.message and "model_ctx.onnx" in err.message
    err = run("asset-file", {**good, data_e["digest"]: b"\0" * data_e["size"]}, [onnx_e, data_e])
    assert "(shared-asset)" in err.message
    not_onnx = b"not an onnx model"
    bad = {"path": "model.onnx", "digest": "sha256:" + hashlib.sha256(not_onnx).hexdigest(), "size": len(not_onnx)}
    err = run("cpu-run", {bad["digest"]: not_onnx}, [bad])
    assert "(cpu-run)" in err.message


def test_the_cpu_variant_is_checked_on_the_models_sample_inputs(env: dict[str, str], tmp_path: Path):
    from farm.core.keys import sha256_file
    from registry.evidence import record_samples
    from registry.index import Registry, resolve_model_ref
    from registry.store.base import put_file

    model = tmp_path / "mm.onnx"
    matmul_model(model)
    farm(env, "build", str(model), "-t", "qnn:SM8650", "--name", "smp", "--tag", "t1")
    npz = tmp_path / "sample.npz"
    np.savez(npz, x=np.full((1, 64), 0.5, np.float32))
    digest, size = sha256_file(npz)
    reg = Registry.open(Settings.from_env({"FARM_HOME": env["FARM_HOME"]}))
    try:
        put_file(reg.store, npz, expected=digest)
        with reg.db.session() as s:
            record_samples(s, resolve_model_ref(s, "smp:t1"), digest, size,
                           [{"name": "x", "dtype": "float32", "shape": [1, 64]}])
    finally:
        reg.close()
    got = package(env, "smp:t1")
    assert got["evidence"]["components"][0]["inputs"] == digest
    assert got["evidence"]["components"][0]["outputs"][0] == {"name": "y", "shape": [1, 64], "finite": True}
    # Garbage collection keeps every blob of a package (its record and ORT's manifest too).
    from registry.verify import referenced_digests

    reg = Registry.open(Settings.from_env({"FARM_HOME": env["FARM_HOME"]}))
    try:
        with reg.db.session() as s:
            refs = referenced_digests(s)
    finally:
        reg.close()
    assert {f["digest"] for f in got["files"]} | {got["digest"]} <= refs


def test_package_on_postgres_and_s3_as_on_the_embedded_stack(cluster_settings: Settings, tmp_path: Path):
    """The same package code on SQLite + a blob directory and on PostgreSQL + S3 (SeaweedFS)."""
    from farm.pipeline.packages import install_package, make_package
    from farm.pipeline.plan import build
    from registry.index import Registry

    model = tmp_path / "mm.onnx"
    matmul_model(model)
    (o,) = build(cluster_settings, model, ["qnn:SM8650"], name="cl", tag="t1").outcomes
    assert o.artifact
    reg = Registry.open(cluster_settings)
    try:
        made = make_package(cluster_settings, reg, "cl:t1")
        assert made["cached"] is False and [v["ep"] for v in made["components"][0]["variants"]] == [
            "QNNExecutionProvider", "CPUExecutionProvider"]
        assert make_package(cluster_settings, reg, "cl:t1")["digest"] == made["digest"]
        root = install_package(reg, made, tmp_path / "pkg")
    finally:
        reg.close()
    chosen = ort.ModelPackageContext(str(root)).select_component("model", ort.ModelPackageOptions(ort.SessionOptions()))
    assert chosen.get_selected_variant_name() == "cpu"


def test_a_service_without_onnxruntime_has_a_worker_make_the_package(farm_cluster: Any, tmp_path: Path,  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch):
    """A cluster whose service can't make packages (its image has no onnxruntime): POST
    /v1/packages has a QNN 2.51.0 worker (onnxruntime 1.32.0) make it, and answers it; a device
    installs it; asked again, the index answers. The worker's failure is answered with its code;
    a model with no published build is answered by the service itself; with no live worker,
    503 no-worker."""
    from farm.core.errors import MissingExtraError
    from registry.index import set_tag
    from registry.models import Artifact, ArtifactFile
    from tests.common.index_rows import add_artifact, add_model
    from tests.common.inproc import running_service
    from tests.common.service import token
    from workers import ortpackage

    f = farm_cluster
    worker = f.start_worker("2.51.0")
    for seed, name in enumerate(("cw", "gone")):
        model = tmp_path / name / "mm.onnx"
        model.parent.mkdir()
        matmul_model(model, seed)
        f.cli("submit", str(model), "-t", "qnn:SM8650", "--sdk", "2.51.0", "--name", name, "--tag", "v1", "--wait",
              "--timeout", "180")

    def no_onnxruntime() -> str:
        raise MissingExtraError("this service has no onnxruntime (the API image)")

    monkeypatch.setattr(ortpackage, "runtime", no_onnxruntime)
    settings = Settings.from_env(f.env)
    reg = f.db()
    try:
        with reg.db.session() as s:
            set_tag(s, "bare", "v1", add_model(s, label="bare", name="bare").digest)
        with running_service(settings) as svc:
            made = json.loads(f.cli("package", "cw:v1", "--server", svc["url"], "--token", svc["token"],
                                    "-d", str(tmp_path / "pkg"), "--json").stdout)
            assert made["cached"] is False and made["evidence"]["onnxruntime"].startswith("1.32")
            # Made by the worker (the service can't): one message, taken from its probe queue.
            assert "ctxfarm.make_package" in next(f.tmp.glob("worker-2.51.0-*.log")).read_text()
            chosen = ort.ModelPackageContext(str(tmp_path / "pkg")).select_component(
                "model", ort.ModelPackageOptions(ort.SessionOptions()))
            assert chosen.get_selected_variant_name() == "cpu"
            read = token(settings, "device", "read")
            got = json.loads(f.cli("install", "--package", "cw:v1", "--server", svc["url"], "--token", read,
                                   "-d", str(tmp_path / "device"), "--json").stdout)
            assert got["artifact"] == made["digest"] and (tmp_path / "device" / "manifest.json").is_file()
            again = json.loads(f.cli("package", "cw:v1", "--server", svc["url"], "--token", svc["token"],
                                     "--json").stdout)
            assert again["cached"] is True and again["digest"] == made["digest"]

            # The worker fails (a context file gone from the store): its code, nothing published.
            with reg.db.session() as s:
                from sqlalchemy import select

                from registry.index import resolve_model_ref

                blob = s.scalar(select(ArtifactFile.digest).join(Artifact).where(
                    Artifact.model_digest == resolve_model_ref(s, "gone:v1"), ArtifactFile.role == "context"))
            reg.store.delete(blob)
            proc = f.cli("package", "gone:v1", "--server", svc["url"], "--token", svc["token"], "--json", check=False)
            assert proc.returncode == 1 and json.loads(proc.stdout)["error"]["code"] == "package-files-missing", (
                proc.stdout, proc.stderr)
            # No published build: the service says so itself.
            proc = f.cli("package", "bare:v1", "--server", svc["url"], "--token", svc["token"], "--json", check=False)
            assert proc.returncode == 3 and json.loads(proc.stdout)["error"]["code"] == "no-published-builds"

            # No live worker with onnxruntime >= 1.32: 503 no-worker, its hint naming one that has it.
            with reg.db.session() as s:
                fake = add_model(s, label="fake", name="fake")
                set_tag(s, "fake", "v1", fake.digest)
                add_artifact(s, fake.digest)
            f.kill(worker, signal.SIGTERM)
            import urllib.error
            import urllib.request

            post = urllib.request.Request(f"{svc['url']}/v1/packages", data=json.dumps({"ref": "fake:v1"}).encode(),
                                          headers={"Authorization": f"Bearer {svc['token']}",
                                                   "Content-Type": "application/json"}, method="POST")
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(post, timeout=30)
            err = json.loads(e.value.read())["error"]
            assert e.value.code == 503 and err["code"] == "no-worker" and "2.51.0" in err["hint"], err
            proc = f.cli("package", "fake:v1", "--server", svc["url"], "--token", svc["token"], "--json", check=False)
            # The CLI relays the service's 503 as itself: its code and its hint (which SDK has it).
            err = json.loads(proc.stdout)["error"]
            assert proc.returncode == 1 and err["code"] == "no-worker" and "2.51.0" in err["hint"], err
    finally:
        reg.close()


def test_qnn_2_47_builds_of_two_socs_are_refused_and_one_soc_packages_without_its_string(env: dict[str, str],
                                                                                           tmp_path: Path):
    """QNN 2.47.0 writes one compatibility string for SM8650 and SM8750 (``6:2.47.0:5.47.0:0.0.0:68:0``):
    a package holds it for neither, and refuses the two SoCs side by side (ORT could not tell them
    apart). Built by the 2.47.0 worker environment's own interpreter (its onnxruntime is 1.24);
    packaged by this one (onnxruntime >= 1.32)."""
    python = Path(__file__).resolve().parents[2] / ".venvs" / "qnn-2.47.0" / "bin" / "python"
    if not python.exists():
        pytest.skip("no QNN 2.47.0 worker environment (.venvs/qnn-2.47.0)")
    import subprocess

    model = tmp_path / "src" / "mm.onnx"
    model.parent.mkdir()
    matmul_model(model)

    def build(target: str) -> None:
        subprocess.run([str(python), "-m", "farm.cli", "build", str(model), "-t", target, "--name", "old", "--tag",
                        "s"], env=env, check=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)

    build("qnn:SM8650")
    dest = tmp_path / "pkg"
    answer = package(env, "old:s", "-d", str(dest))
    [qnn] = [v for v in answer["components"][0]["variants"] if v["ep"] == "QNNExecutionProvider"]
    assert (qnn["toolchain"], qnn["compatibility_string"]) == ("2.47.0", None)
    shown = json.loads(farm(env, "show", qnn["artifact"][7:19], "--json").stdout)
    recorded = shown["compatibility"]["QNNExecutionProvider"]
    assert recorded.startswith("6:2.47.0:") and not recorded.startswith("v2:")  # no SoC field
    variant = json.loads((dest / "manifest.json").read_text())["components"]["model"]["variants"][qnn["name"]]
    assert "compatibility_string" not in variant  # ORT asks the EP nothing: scored by EP and device
    assert variant["additional_metadata"]["ctxfarm"]["ep_compatibility_not_naming_soc"] == recorded
    assert variant["executor_info"]["ort"]["provider_options"] == {"soc_model": "57"}

    build("qnn:SM8750")
    proc = package(env, "old:s", "-d", str(tmp_path / "pkg2"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "package-ambiguous-variants" and "qnn:SM8750 (2.47.0)" in error["message"]
    assert not (tmp_path / "pkg2").exists()
