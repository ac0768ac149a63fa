"""The device client against a hostile service (``tests/common/hostile_server.py``) serving each
crafted answer of the corpus (``tests/common/hostile_answers.py``): the right error code, no
traceback, nothing written or deleted outside --dest, no token sent after a redirect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from farm.client import install, main
from farm.core.errors import FarmError
from tests.common.hostile_answers import CASES, Case, Where
from tests.common.hostile_server import BIN, CTX, QNN, SOC, Scenario, fresh, hostile_service

TOKEN = "cfk_device-secret"
OPERATOR_ONLY = ("farm registry", "farm fetch", "farm build", "farm keys", "compile with")


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (with its content for a file), except the install's own."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.split("/")[0] in ("device",) and len(rel.split("/")) > 1 and rel.split("/")[1] in (
                "sq", ".sq.ctxfarm-partial"):
            continue
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def _ask(case: Case, dest: Path) -> dict[str, Any]:
    return {"model": "sq:stable", "soc": SOC, "qnn": QNN, "dest": dest, **case.ask}


def _argv(url: str, ask: dict[str, Any]) -> list[str]:
    argv = ["--server", url, "--token", TOKEN, "--model", ask["model"], "--dest", str(ask["dest"]), "--json"]
    for flag in ("soc", "qnn", "gpu", "trt", "timeout"):
        if ask.get(flag):
            argv += [f"--{flag}", str(ask[flag])]
    return argv


def _ranged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario's 10 KiB .bin fetched as a large file is: in 4 KiB ranges, 4 at once."""
    import farm.client.downloads

    monkeypatch.setattr(farm.client.downloads, "RANGE_PART", 4096)  # read where a download is planned
    monkeypatch.setattr(farm.client.downloads, "RANGED_FROM", 4096)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("case", "mode"), [pytest.param(c, m, id=f"{m}: {c.name}") for c in CASES for m in c.modes])
def test_device_client_refuses_a_hostile_answer(case: Case, mode: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "ranged":
        _ranged(monkeypatch)
    victim = tmp_path / "device" / "victim" / "keep.txt"
    victim.parent.mkdir(parents=True)
    victim.write_text("keep")
    where = Where(victim, tmp_path / "planted.txt")
    scenario: Scenario = fresh()
    case.mutate(scenario, where)
    dest = tmp_path / "device" / "sq"
    ask = _ask(case, dest)
    before = _tree(tmp_path)
    with hostile_service(scenario) as url:
        kwargs = {k: v for k, v in ask.items() if k != "model"}
        if case.code == "ok":
            got = install(url, TOKEN, ask["model"], **kwargs)
            assert (dest / "model_ctx.onnx").read_bytes() == CTX and (dest / "model_ctx_qnn.bin").read_bytes() == BIN
            assert got.ctx_model == dest / "model_ctx.onnx" and got.bytes == len(CTX) + len(BIN)
            # Nothing beside the install: no partial directory, no lock file.
            assert sorted(os.listdir(dest.parent)) == ["sq", "victim"]
        else:
            with pytest.raises(FarmError) as exc:
                install(url, TOKEN, ask["model"], **kwargs)
            assert exc.value.code == case.code, exc.value.message
            assert not dest.exists()
            assert "\x1b" not in exc.value.message and "\x1b" not in (exc.value.hint or "")
            # A device's hints are things a device can do: no operator commands.
            assert not any(op in (exc.value.hint or "") for op in OPERATOR_ONLY), exc.value.hint
        # The token goes to the service only, never after a redirect.
        assert all("authorization" not in h for p, h in scenario.seen if not p.startswith(("/v1/", )))
        # The same through the device command: a documented code, no traceback.
        if case.ask.get("trusted_keys"):
            monkeypatch.setenv("FARM_TRUSTED_KEYS", ",".join(case.ask["trusted_keys"]))
        capsys.readouterr()
        rc = main(_argv(url, {**ask, "dest": tmp_path / "device" / "sq2"}))
        out, err = capsys.readouterr()
    assert "Traceback" not in err and not any(op in err for op in OPERATOR_ONLY)
    if case.code == "ok":
        assert rc == 0
    else:
        assert rc != 0 and f"error[{case.code}]" in err, err
        assert json.loads(out.strip().splitlines()[-1])["error"]["code"] == case.code
    assert victim.read_text() == "keep"
    assert not where.planted.exists()
    after = {k: v for k, v in _tree(tmp_path).items() if not k.startswith(("device/sq2", "device/.sq2.ctxfarm-"))}
    assert after == before


@pytest.mark.timeout(120)
def test_farm_install_cli_refuses_without_a_traceback(tmp_path: Path) -> None:
    """The full CLI (`farm install`) on two of the cases: the documented code, exit 1, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(tmp_path / "home")
    for name in ("digest path traversal", "redirect to file://", "control"):
        case = next(c for c in CASES if c.name == name)
        scenario = fresh()
        victim = tmp_path / "device" / "victim" / "keep.txt"
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("keep")
        case.mutate(scenario, Where(victim, tmp_path / "planted.txt"))
        dest = tmp_path / "device" / "sq"
        with hostile_service(scenario) as url:
            proc = subprocess.run([sys.executable, "-m", "farm.cli", "install", "--server", url, "--token", TOKEN,
                                   "--model", "sq:stable", "--soc", SOC, "--qnn", QNN, "--dest", str(dest)],
                                  env=env, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in proc.stderr
        if case.code == "ok":
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout.strip() == str(dest / "model_ctx.onnx")
            assert sorted(os.listdir(dest.parent)) == ["sq", "victim"]
        else:
            assert proc.returncode == 1 and f"error[{case.code}]" in proc.stderr, proc.stderr
        assert victim.read_text() == "keep"


def test_an_interrupted_download_resumes_from_the_partial_file(tmp_path: Path) -> None:
    """A connection cut mid-blob keeps what arrived; the next install asks for the rest (Range)
    and the result is whole. A partial file longer than the blob, or whose bytes are wrong, is
    started over."""
    from tests.common.hostile_server import Raw

    scenario = fresh()
    scenario.seal()
    digest = scenario.digest_of("model_ctx_qnn.bin")
    path = f"/v1/blobs/{digest}"
    scenario.routes[path] = Raw(200, [], BIN[:1000], length=False)
    dest = tmp_path / "device" / "sq"
    with hostile_service(scenario) as url:
        with pytest.raises(FarmError) as exc:
            install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert exc.value.code == "server-error" and "resumes" in (exc.value.hint or "")
        partial = dest.parent / ".sq.ctxfarm-partial" / digest[7:]
        assert partial.read_bytes() == BIN[:1000]
        del scenario.routes[path]
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert got.resumed_bytes == len(CTX) + 1000 and (dest / "model_ctx_qnn.bin").read_bytes() == BIN
        ranges = [h.get("range") for p, h in scenario.seen if p == path]
        assert ranges[-1] == "bytes=1000-"
        # A partial file longer than the blob (another blob's, a corrupt one): started over.
        partial.parent.mkdir()
        partial.write_bytes(b"x" * (len(BIN) + 5))
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert got.resumed_bytes == 0 and (dest / "model_ctx_qnn.bin").read_bytes() == BIN
        # A partial file of the right size and the wrong bytes: discarded, downloaded again.
        partial.parent.mkdir()
        partial.write_bytes(b"z" * len(BIN))
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert got.resumed_bytes == 0 and (dest / "model_ctx_qnn.bin").read_bytes() == BIN
    assert sorted(os.listdir(dest.parent)) == ["sq"]


@pytest.mark.parametrize("name", ["control", "answer a list", "answer for another backend", "answer for another SoC",
                                  "answer artifact traversal", "404 no-match relayed, escapes cleaned"])
def test_farm_resolve_server_checks_what_it_prints(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`farm resolve --server` is a device's question too: the same checks and binding as an
    install, and nothing the service wrote reaches the terminal uncleaned."""
    from farm.cli import main as farm

    monkeypatch.setenv("FARM_HOME", str(tmp_path / "home"))
    case = next(c for c in CASES if c.name == name)
    scenario = fresh()
    case.mutate(scenario, Where(tmp_path / "victim", tmp_path / "planted"))
    if isinstance(scenario.answer, dict):
        scenario.answer["reason"] = "same SoC \x1b[2J\x1b]0;owned\x07"
    with hostile_service(scenario) as url:
        capsys.readouterr()
        rc = farm(["resolve", "--server", url, "--token", TOKEN, "--model", "sq:stable", "--soc", SOC, "--qnn", QNN])
        out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "Traceback" not in err
    if case.code == "ok":
        assert rc == 0 and scenario.answer["artifact"][7:19] in out and "model_ctx_qnn.bin" in out
    else:
        assert rc != 0 and f"error[{case.code}]" in err, err


def test_a_signature_binds_the_manifest(tmp_path: Path) -> None:
    """With a trusted key: a signature over the manifest digest installs; the same signature
    beside another manifest (the service re-pointed the answer) is refused."""
    import base64

    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = ed25519.Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    signed = fresh()
    signed.seal()
    sig = base64.b64encode(key.sign(b"ctxfarm-manifest-v1\n" + signed.answer["artifact"].encode())).decode()
    signed.answer["signatures"] = [{"public_key": public, "signature": sig}]
    with hostile_service(signed) as url:
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=tmp_path / "a", trusted_keys=[public])
    assert got.signed_by is not None and (tmp_path / "a" / "model_ctx_qnn.bin").read_bytes() == BIN
    other = fresh()
    other.manifest["files"] = [f for f in other.manifest["files"] if f["name"] == "model_ctx.onnx"]
    other.answer["signatures"] = [{"public_key": public, "signature": sig}]
    with hostile_service(other) as url, pytest.raises(FarmError) as exc:
        install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=tmp_path / "b", trusted_keys=[public])
    assert exc.value.code == "signature-invalid" and not (tmp_path / "b").exists()


def test_ranges_go_straight_to_where_the_service_redirected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first range asks the service, which redirects (a presigned URL); the other ranges go
    straight there, several at once, without the token."""
    from tests.common.hostile_answers import _ranged_redirect

    _ranged(monkeypatch)
    scenario = fresh()
    _ranged_redirect(scenario, Where(tmp_path / "v", tmp_path / "p"))
    digest = scenario.digest_of("model_ctx_qnn.bin")
    with hostile_service(scenario) as url:
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=tmp_path / "sq")
    assert (tmp_path / "sq" / "model_ctx_qnn.bin").read_bytes() == BIN and got.downloaded_bytes == len(CTX) + len(BIN)
    service = [h for p, h in scenario.seen if p == f"/v1/blobs/{digest}"]
    store = [h for p, h in scenario.seen if p == f"/store/{digest[7:]}"]
    assert len(service) == 1 and service[0]["range"] == "bytes=0-4095" and "authorization" in service[0]
    assert sorted(h["range"] for h in store) == ["bytes=0-4095", "bytes=4096-8191", "bytes=8192-10239"]
    assert not any("authorization" in h for h in store)


def test_an_interrupted_ranged_download_resumes_its_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range cut mid-way: what every connection wrote is kept (its .ranges record says which
    bytes), and the next install asks only for the bytes still missing."""
    import farm.client
    from tests.common.hostile_server import Raw, ranged

    _ranged(monkeypatch)
    scenario = fresh()
    scenario.seal()
    digest = scenario.digest_of("model_ctx_qnn.bin")
    path = f"/v1/blobs/{digest}"

    def cut(request: Any) -> Raw:
        good = ranged(request, BIN)
        if request.headers.get("Range") == "bytes=4096-8191":  # the second range: 1000 of its bytes
            return Raw(206, good.headers, good.body[:1000], length=False)
        return good
    scenario.routes[path] = cut
    dest = tmp_path / "device" / "sq"
    partial = dest.parent / ".sq.ctxfarm-partial" / digest[7:]
    with hostile_service(scenario) as url:
        with pytest.raises(FarmError) as exc:
            install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert exc.value.code == "server-error" and "resumes" in (exc.value.hint or "") and not dest.exists()
        record = json.loads(partial.with_name(partial.name + ".ranges").read_text())
        # The first range and 1000 bytes of the second; the third too if a connection had taken
        # it before the cut stopped them all.
        assert record["size"] == len(BIN) and record["done"][0] == [0, 4096 + 1000]
        assert record["done"][1:] in ([], [[8192, len(BIN)]]), record
        data = partial.read_bytes()
        assert all(data[a:b] == BIN[a:b] for a, b in record["done"])
        kept = sum(b - a for a, b in record["done"])
        del scenario.routes[path]
        scenario.seen.clear()
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
    assert (dest / "model_ctx_qnn.bin").read_bytes() == BIN and (dest / "model_ctx.onnx").read_bytes() == CTX
    asked = sorted(h.get("range") for p, h in scenario.seen if p == path)
    # Only the missing bytes, in parts of at most RANGE_PART: 5096-8191 (the third was kept), or
    # 5096-9191 and 9192-10239.
    done = [(a, b) for a, b in record["done"]]
    assert asked == sorted(f"bytes={a}-{b - 1}" for a, b in farm.client.plan_ranges(len(BIN), done, 4096))
    assert asked in (["bytes=5096-8191"], ["bytes=5096-9191", "bytes=9192-10239"])
    assert got.resumed_bytes == len(CTX) + kept and got.downloaded_bytes == len(BIN) - kept
    assert sorted(os.listdir(dest.parent)) == ["sq"]


@pytest.mark.parametrize("mode", ["stream", "ranged"])
def test_a_reinstall_moves_only_what_the_destination_lacks(mode: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An up-to-date destination: no blob asked, nothing moved (the same directory, the same
    files). One file changed or missing: only that one fetched. A file too many: swapped out,
    nothing fetched. A symlink where a file goes is not followed, never taken."""
    if mode == "ranged":
        _ranged(monkeypatch)
    scenario = fresh()
    dest = tmp_path / "device" / "sq"
    blobs = lambda: [p for p, _ in scenario.seen if p.startswith("/v1/blobs/") and p[10:] != scenario.answer["artifact"]]  # noqa: E731
    with hostile_service(scenario) as url:
        first = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert first.downloaded_bytes == len(CTX) + len(BIN) and first.reused_bytes == 0
        before = {n: os.stat(dest / n) for n in ("model_ctx.onnx", "model_ctx_qnn.bin")}
        ino = os.stat(dest).st_ino
        scenario.seen.clear()
        again = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert blobs() == [] and again.downloaded_bytes == 0 and again.reused_bytes == len(CTX) + len(BIN)
        assert os.stat(dest).st_ino == ino
        assert all(os.stat(dest / n).st_ino == s.st_ino and os.stat(dest / n).st_mtime_ns == s.st_mtime_ns
                   for n, s in before.items())
        assert sorted(os.listdir(dest.parent)) == ["sq"]
        # Same size, other bytes (a corrupt copy): fetched again, the other file taken.
        (dest / "model_ctx_qnn.bin").unlink()
        (dest / "model_ctx_qnn.bin").write_bytes(b"z" * len(BIN))
        scenario.seen.clear()
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert set(blobs()) == {f"/v1/blobs/{scenario.digest_of('model_ctx_qnn.bin')}"}
        assert got.downloaded_bytes == len(BIN) and got.reused_bytes == len(CTX)
        assert (dest / "model_ctx_qnn.bin").read_bytes() == BIN
        # Missing.
        (dest / "model_ctx.onnx").unlink()
        scenario.seen.clear()
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert set(blobs()) == {f"/v1/blobs/{scenario.digest_of('model_ctx.onnx')}"}
        assert got.downloaded_bytes == len(CTX) and (dest / "model_ctx.onnx").read_bytes() == CTX
        # A file beside them: the destination holds exactly the artifact again, nothing fetched.
        (dest / "stray.txt").write_text("stray")
        scenario.seen.clear()
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert blobs() == [] and got.downloaded_bytes == 0 and sorted(os.listdir(dest)) == sorted(
            ["model_ctx.onnx", "model_ctx_qnn.bin"])
        # A symlink where the .bin goes, to a file of the right bytes outside --dest: not taken.
        outside = tmp_path / "outside.bin"
        outside.write_bytes(BIN)
        (dest / "model_ctx_qnn.bin").unlink()
        (dest / "model_ctx_qnn.bin").symlink_to(outside)
        scenario.seen.clear()
        got = install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=dest)
        assert got.downloaded_bytes == len(BIN) and not (dest / "model_ctx_qnn.bin").is_symlink()
        assert outside.read_bytes() == BIN and (dest / "model_ctx_qnn.bin").read_bytes() == BIN
    assert sorted(os.listdir(dest.parent)) == ["sq"]


@pytest.mark.parametrize("connections", [0, 17, -1])
def test_connections_out_of_bounds_are_a_usage_error(connections: int, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing is asked of the service for a connection count outside 1 to MAX_CONNECTIONS."""
    scenario = fresh()
    with hostile_service(scenario) as url:
        with pytest.raises(FarmError) as exc:
            install(url, TOKEN, "sq:stable", soc=SOC, qnn=QNN, dest=tmp_path / "sq", connections=connections)
        assert exc.value.code == "usage" and exc.value.hint
        rc = main(["--server", url, "--model", "sq:stable", "--soc", SOC, "--qnn", QNN, "--dest",
                   str(tmp_path / "sq"), "--connections", str(connections)])
    assert rc == 2 and "error[usage]" in capsys.readouterr().err
    assert scenario.seen == [] and not (tmp_path / "sq").exists()
