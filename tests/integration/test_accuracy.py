"""The accuracy gate for real: QNN 2.51.0 contexts run on the x86_64 HTP simulator
against onnxruntime's CPU EP. A 64x64 MatMul with seeded weights passes --min-psnr 30 (fp16
rounding, about 77 dB); the same MatMul followed by x 1e5 then x 1e-5 (beyond fp16's range) fails
it with accuracy-below-threshold naming output 'y', while its artifact is still published once.
A run over its time budget records ``skipped: over N s`` and the gate says accuracy-unverified."""

from __future__ import annotations

import json
from pathlib import Path

from farm.core.settings import Settings
from registry.index import Registry
from tests.common.accuracy_models import matmul_model
from tests.common.cli import farm


def _accuracy_rows(settings: Settings) -> list[tuple[int, str, str]]:
    from sqlalchemy import text

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return [tuple(r) for r in s.execute(text(  # type: ignore[misc]
                "SELECT artifact_id, status, inputs FROM accuracy_results ORDER BY artifact_id"))]
    finally:
        reg.close()


def test_min_psnr_gate_on_the_simulator(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    good = matmul_model(tmp_path / "matmul.onnx")
    bad = matmul_model(tmp_path / "overflow.onnx", overflow=True)
    proc = farm(farm_env, "build", str(good), str(bad), "-t", "qnn:SM8650", "--min-psnr", "30", "--json",
                check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    ok, failed = (m["builds"][0] for m in doc["models"])
    assert ok["state"] == "built" and ok["accuracy"]["status"] == "ok"
    assert 60 < ok["accuracy"]["min_psnr_db"] < 100
    assert failed["state"] == "failed" and failed["error_code"] == "accuracy-below-threshold"
    assert "output 'y'" in failed["error_message"] and "PSNR" in failed["error_message"]
    (fig,) = failed["accuracy"]["outputs"]
    assert fig["name"] == "y" and fig["psnr_db"] < 15 and fig["cosine"] < 0.95 and fig["max_abs_error"] > 1
    assert failed["artifact"], "the artifact is published whatever the gate says"

    # Published once: the artifact exists and shows its figures; asking again compiles and runs nothing.
    shown = json.loads(farm(farm_env, "show", failed["artifact"], "--json").stdout)
    assert shown["accuracy"][0]["status"] == "ok" and shown["accuracy"][0]["worst_output"] == "y"
    before = _accuracy_rows(settings)
    again = json.loads(farm(farm_env, "build", str(bad), "-t", "qnn:SM8650", "--min-psnr", "5", "--json").stdout)
    assert again["builds"][0]["state"] == "cached" and again["builds"][0]["accuracy"]["min_psnr_db"] < 15
    assert _accuracy_rows(settings) == before and len(before) == 2
    ls = json.loads(farm(farm_env, "ls", "--json").stdout)
    assert len(ls) == 2
    # farm resolve (the fast path on the local index) says what the check found.
    res = json.loads(farm(farm_env, "resolve", "--model", doc["models"][1]["model"], "--soc", "SM8650", "--qnn",
                          "2.51.0", "--json").stdout)
    assert res["accuracy"]["status"] == "ok" and res["accuracy"]["worst_output"] == "y"
    text = farm(farm_env, "resolve", "--model", doc["models"][0]["model"], "--soc", "SM8650", "--qnn", "2.51.0").stdout
    assert "accuracy vs CPU on qnn:2.51.0" in text


def test_over_budget_is_skipped_and_unverified(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    model = matmul_model(tmp_path / "m.onnx", seed=7)
    # 1 ms: a run forked from a warm host can finish a 64x64 MatMul within 50 ms on an idle box.
    env = {**farm_env, "FARM_ACCURACY_BUDGET": "0.001"}
    proc = farm(env, "build", str(model), "-t", "qnn:SM8650", "--min-psnr", "30", "--json", check=False)
    assert proc.returncode == 1
    (b,) = json.loads(proc.stdout)["builds"]
    assert b["error_code"] == "accuracy-unverified" and b["accuracy"]["status"] == "skipped"
    assert "skipped: over 0.001 s" in b["accuracy"]["detail"]


def test_release_gate_over_http(tmp_path: Path) -> None:
    """POST /v1/releases with min_psnr on the embedded service: each build stays ``running``
    (accuracy check pending) until its check ran, then the overflow model's build is answered
    accuracy-below-threshold naming the output; the plain model's passes."""
    import time

    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from registry.tokens import create_token

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tok = create_token(s, "ci", "submit")
    reg.close()
    auth = {"Authorization": f"Bearer {tok}"}
    with TestClient(create_app(settings)) as client:
        answers = {}
        for name, overflow in (("plain", False), ("overflow", True)):
            data = matmul_model(tmp_path / f"{name}.onnx", overflow=overflow).read_bytes()
            r = client.post(f"/v1/models?name={name}&tag=v1", content=data, headers=auth)
            assert r.status_code == 200, r.text
            r = client.post("/v1/releases", json={"model": f"{name}:v1", "targets": ["qnn:SM8650"],
                                                  "min_psnr": 30}, headers=auth)
            assert r.status_code == 200, r.text
            release = r.json()["release"]
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                st = client.get(f"/v1/releases/{release}?wait=5", headers=auth).json()
                if st["done"]:
                    break
            answers[name] = st
        assert answers["plain"]["ok"] and answers["plain"]["builds"][0]["state"] == "succeeded"
        (b,) = answers["overflow"]["builds"]
        assert not answers["overflow"]["ok"] and b["state"] == "failed"
        assert b["error_code"] == "accuracy-below-threshold" and "output 'y'" in b["error_message"]
        assert b["artifact"], "published whatever the gate says"
        page = client.get("/v1/coverage/models?model=overflow:v1&model=plain:v1", headers=auth).json()
        figures = {m["name"]: m["cells"][0]["accuracy_min_psnr_db"] for m in page["models"]}
        assert figures["overflow"] < 15 < 60 < figures["plain"], page
        bad = client.post("/v1/releases", json={"model": "plain:v1", "targets": ["qnn:SM8650"], "min_psnr": -1},
                          headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "usage"


def test_sample_inputs_upload_is_validated_and_used(tmp_path: Path) -> None:
    """POST /v1/models/{digest}/samples: an .npz checked against the model's inputs like any
    upload (hostile ones refused with codes, nothing recorded); a check then feeds it and records
    its digest as the inputs."""
    import io

    import numpy as np
    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from farm.pipeline.accuracy import evaluate
    from farm.pipeline.plan import build
    from registry.index import find_artifact
    from registry.tokens import create_token

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    (o,) = build(settings, matmul_model(tmp_path / "m.onnx"), ["qnn:SM8650"]).outcomes
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tok = create_token(s, "ci", "submit")
        read = create_token(s, "dev", "read")
        art = find_artifact(s, o.artifact)
        model, artifact_id = art.model_digest, art.id

    def npz(**arrays: object) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    x = np.random.default_rng(5).standard_normal((1, 64)).astype(np.float32)
    hostile = [
        (npz(x=x.astype(np.float64)), 400, "bad-samples"),
        (npz(x=x.reshape(64, 1)), 400, "bad-samples"),
        (npz(y=x), 400, "bad-samples"),
        (npz(x=x, extra=x), 400, "bad-samples"),
        (npz(x=np.array([{"a": 1}], dtype=object)), 400, "bad-samples"),
        (b"not a zip", 400, "bad-samples"),
        (b"\0" * (64 * 1024 * 1024 + 1), 413, "too-large"),
    ]
    with TestClient(create_app(settings, reg)) as client:
        url = f"/v1/models/{model}/samples"
        for body, status, code in hostile:
            r = client.post(url, content=body, headers={"Authorization": f"Bearer {tok}"})
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
        assert client.post(url, content=npz(x=x), headers={"Authorization": f"Bearer {read}"}).status_code == 403
        r = client.post(f"/v1/models/sha256:{'0' * 64}/samples", content=npz(x=x),
                        headers={"Authorization": f"Bearer {tok}"})
        assert r.status_code == 404
        r = client.post(url, content=npz(x=x), headers={"Authorization": f"Bearer {tok}"})
        assert r.status_code == 200, r.text
        sample = r.json()["samples"]
        assert r.json()["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 64]}]
    view = evaluate(settings, reg, artifact_id)
    reg.close()
    assert view is not None and view["status"] == "ok" and view["inputs"] == sample
    assert 60 < view["min_psnr_db"] < 100


def test_build_with_samples(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    """farm build --samples: checked against the model before anything is built (a bad one is a
    bad-samples error and nothing is compiled), then fed to the check, whose inputs are its digest."""
    import numpy as np

    model = matmul_model(tmp_path / "m.onnx", seed=3)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((1, 64), np.float64))
    proc = farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--samples", str(bad), check=False)
    assert proc.returncode == 2 and "error[bad-samples]" in proc.stderr and "float64" in proc.stderr
    assert json.loads(farm(farm_env, "ls", "--json").stdout) == []
    good = tmp_path / "good.npz"
    np.savez(good, x=np.random.default_rng(9).standard_normal((1, 64)).astype(np.float32))
    (b,) = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--samples", str(good),
                           "--json").stdout)["builds"]
    assert b["accuracy"]["status"] == "ok" and b["accuracy"]["inputs"].startswith("sha256:")
    assert 60 < b["accuracy"]["min_psnr_db"] < 100


def test_ungated_release_answers_at_publication_and_the_check_follows_idle(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """FARM_ACCURACY=after on the embedded service: an ungated release is answered when
    its artifact is published; its check follows on the background checker at SCHED_IDLE and then
    updates the evidence. A --min-psnr release still waits for its check, run at nice 10."""
    import time

    from fastapi.testclient import TestClient

    import workers.backends
    from farm.api.app import create_app
    from farm.pipeline.accuracy import background_idle
    from registry.tokens import create_token

    real = workers.backends.check_accuracy
    seen: list[tuple[bool, str | None]] = []

    def spy(*args, **kw):  # type: ignore[no-untyped-def]
        out = real(*args, **kw)
        seen.append((bool(kw.get("idle")), out.get("scheduler")))
        return out

    monkeypatch.setattr(workers.backends, "check_accuracy", spy)
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_ACCURACY": "after"})
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tok = create_token(s, "ci", "submit")
    reg.close()
    auth = {"Authorization": f"Bearer {tok}"}

    def release(client: TestClient, name: str, seed: int, **extra: object) -> dict:  # type: ignore[type-arg]
        data = matmul_model(tmp_path / f"{name}.onnx", seed=seed).read_bytes()
        assert client.post(f"/v1/models?name={name}&tag=v1", content=data, headers=auth).status_code == 200
        r = client.post("/v1/releases", json={"model": f"{name}:v1", "targets": ["qnn:SM8650"], **extra}, headers=auth)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 240
        st = r.json()
        while not st["done"] and time.monotonic() < deadline:
            st = client.get(f"/v1/releases/{st['release']}?wait=5", headers=auth).json()
        return st  # type: ignore[no-any-return]

    with TestClient(create_app(settings)) as client:
        st = release(client, "plain", 3)
        (b,) = st["builds"]
        assert st["ok"] and b["state"] == "succeeded" and "accuracy" not in (b.get("note") or ""), st
        # The answer came first; the check is queued right after it, then recorded.
        deadline = time.monotonic() + 240
        while not (_accuracy_rows(settings) and background_idle()) and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = _accuracy_rows(settings)
        assert [r[1] for r in rows] == ["ok"], rows  # the evidence, updated after the answer
        assert seen == [(True, "idle")], seen

        st = release(client, "gated", 4, min_psnr=30)
        assert st["ok"] and "accuracy" in (st["builds"][0].get("note") or ""), st
        assert seen[-1] == (False, "nice 10"), seen


def test_a_check_stopped_by_its_cancel_flag_records_nothing(settings: Settings, farm_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    """A background check preempted by a build: a flag set before the check starts no
    child; one set while its real child on the simulator starts has that child killed (the flag is
    read as the job starts, so even a job shorter than one poll is stopped); LeaseLostError comes
    back each time and nothing is recorded; the next run (no flag) records the figures on the same
    warm host."""
    import threading

    import pytest

    class SetAsTheJobStarts:
        """False when the host is asked for the job, True from then on: a build arrived meanwhile."""

        def __init__(self) -> None:
            self.reads = 0

        def is_set(self) -> bool:
            self.reads += 1
            return self.reads > 1

    from farm.core.errors import LeaseLostError
    from farm.pipeline.accuracy import evaluate

    model = matmul_model(tmp_path / "m.onnx", seed=11)
    (b,) = json.loads(farm(farm_env, "build", str(model), "-t", "qnn:SM8650", "--json").stdout)["builds"]
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            from sqlalchemy import text

            (artifact_id,) = s.execute(text("SELECT id FROM artifacts")).one()
        before = threading.Event()
        before.set()
        with pytest.raises(LeaseLostError, match="not started"):  # no job asked of the host
            evaluate(settings, reg, artifact_id, idle=True, cancel=before)
        flag = SetAsTheJobStarts()
        with pytest.raises(LeaseLostError, match="stopped"):
            evaluate(settings, reg, artifact_id, idle=True, cancel=flag)
        assert flag.reads == 2, flag.reads  # once before, once as the job started
        assert _accuracy_rows(settings) == []
        out = evaluate(settings, reg, artifact_id, idle=True)
        assert out is not None and out["status"] == "ok", out
        assert [r[1] for r in _accuracy_rows(settings)] == ["ok"]
    finally:
        reg.close()
    assert b["state"] == "built"
