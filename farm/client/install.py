"""``install``: a device's question to a service answered by an artifact placed under --dest:
resolve, bind the answer to the question, fetch the manifest by the artifact digest and bind it
to the answer, check the signature policy, then fetch, verify and place every file it lists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.client.answers import check_answer, check_manifest_binding, check_signatures, checked_manifest, question
from farm.client.downloads import CONNECTIONS, MAX_CONNECTIONS
from farm.client.placing import fetch_and_place
from farm.client.service import Client
from farm.core.errors import UsageError
from farm.core.names import safe_relative
from farm.core.placement import destination
from farm.core.untrusted import manifest_stages, shown


@dataclass
class InstallResult:
    artifact: str
    ctx_model: Path
    files: list[Path]
    bytes: int
    resumed_bytes: int
    signed_by: str | None
    downloaded_bytes: int = 0  # received over the network for this install's files
    reused_bytes: int = 0  # verified where --dest already held them: not fetched, not moved
    stages: list[dict[str, str]] = field(default_factory=list)  # each file's role (a group, a genai package)


def install(server: str, token: str | None, model: str, *, dest: str | os.PathLike[str], soc: str | None = None,
            qnn: str | None = None, gpu: str | None = None, trt: str | None = None,
            platform: str = "linux-x86-64", trusted_keys: list[str] | None = None,
            require_signature: bool = False, allow_unsigned: bool = False, timeout: float = 60.0,
            connections: int = CONNECTIONS) -> InstallResult:
    """Resolve, download (resuming), verify and place an artifact; see ``farm.client``.
    ``timeout``: seconds any network operation may wait (an answer's body gets twice that);
    ``connections``: how many ranges of one large file are fetched at once (1 to
    ``MAX_CONNECTIONS``; 1: one stream per file)."""
    if type(connections) is not int or not 1 <= connections <= MAX_CONNECTIONS:
        raise UsageError(f"connections {shown(connections)} is not a whole number from 1 to {MAX_CONNECTIONS}",
                         hint=f"e.g. --connections {CONNECTIONS}")
    q = question(model, soc, qnn, gpu, trt, platform)
    client = Client(server, token, timeout=timeout)
    res = check_answer(client.json("GET", "/v1/resolve", model=model, soc=soc, qnn=qnn, gpu=gpu, trt=trt,
                                   platform=platform if gpu else None, manifest="false"), q)
    artifact: str = res["artifact"]
    # The manifest is fetched by the digest that names the artifact, never from a URL in the
    # answer, then bound to the answer; signatures are over that digest.
    manifest = checked_manifest(client.manifest_bytes(artifact, res["manifest_size"]), artifact)
    check_manifest_binding(manifest, res, q)
    stages = manifest_stages(manifest)  # refused before anything is written
    signed_by = check_signatures(artifact, res.get("signatures", []), trusted_keys or [],
                                 required=require_signature, allow_unsigned=allow_unsigned)
    out = destination(Path(dest))
    files: list[dict[str, Any]] = manifest["files"]
    resumed, downloaded, kept = fetch_and_place(client, out, files, connections=connections)
    return InstallResult(artifact, out / safe_relative(manifest["ctxModel"]),
                         [out / safe_relative(f["name"]) for f in files], sum(f["size"] for f in files), resumed,
                         signed_by, downloaded, kept, stages)
