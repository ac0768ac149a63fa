"""The device client against a live `farm serve` whose store is S3 (a real SeaweedFS): blobs held
as is are answered 307 to presigned URLs, which the client follows (http(s) only, without its
token) and verifies like any other byte it receives."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from farm.client import install
from farm.core.settings import Settings
from farm.pipeline.plan import build
from tests.common.onnx_models import light
from tests.common.service import serve, token


class _Stop(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_install_follows_presigned_redirects_to_s3(s3_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(tmp_path / "home"), FARM_STORE_URL=s3_url)
    settings = Settings.from_env(env)
    (outcome,) = build(settings, light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable").outcomes
    read = token(settings, "device", "read")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = serve(env, port, tmp_path / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}"
        req = urllib.request.Request(f"{url}/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0",
                                     headers={"Authorization": f"Bearer {read}"})
        with urllib.request.urlopen(req) as resp:
            files = json.loads(resp.read())["files"]
        redirected = []
        for f in files:
            try:
                urllib.request.build_opener(_Stop()).open(
                    urllib.request.Request(f["url"], headers={"Authorization": f"Bearer {read}"})).close()
            except urllib.error.HTTPError as exc:
                assert exc.code == 307 and exc.headers["Location"].startswith("http://")
                redirected.append(f["name"])
        assert redirected, "no blob went by a presigned URL: the test would not exercise redirects"
        dest = tmp_path / "device" / "sq"
        got = install(url, read, "sq:stable", soc="SM8650", qnn="2.51.0", dest=dest)
    finally:
        proc.terminate()
        proc.wait(10)
    assert got.artifact == outcome.artifact
    for f in files:
        data = (dest / f["name"]).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == f["digest"] and len(data) == f["size"]
    assert sorted(os.listdir(dest.parent)) == ["sq"]
