"""ORT model packages on a device (``farm install --package``, ``ctxfarm-install --package``): the
package's record fetched by its digest, held to its shape and checked, the signature policy
applied to that digest, then every file it lists fetched, verified and placed as an artifact's
files are (``farm.client.placing``). The package's layout is ``farm.core.packages``'s."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from farm.client import shapes
from farm.client.answers import check_signatures
from farm.client.downloads import CONNECTIONS
from farm.client.install import InstallResult
from farm.client.placing import fetch_and_place
from farm.client.service import Client
from farm.client.transport import HINT_SERVER, parse_json
from farm.core.errors import ManifestError, ServerError
from farm.core.names import safe_relative
from farm.core.placement import destination


def install_package_files(client: Client, digest: str, size: int, dest: Path, *, trusted: Any = (),
                          signatures: Any = None, required: bool = False,
                          allow_unsigned: bool = False, connections: int = CONNECTIONS) -> InstallResult:
    """An ORT model package (``farm package --server``) into ``dest``: its record fetched by
    ``digest`` (at most ``size`` bytes, checked against the digest), the signature policy
    applied to that digest, then every file it lists fetched by its digest (each size and
    sha256 verified, resuming) and the whole swapped into place atomically. The result's
    ``ctx_model`` is the package's ``manifest.json`` (``ModelPackageContext`` opens its folder)."""
    from farm.core.packages import MANIFEST, check_record

    shapes.conform({"digest": digest, "record_size": size}, shapes.PACKAGE_ANSWER, "the package answer", ServerError,
                   HINT_SERVER)
    data = client.manifest_bytes(digest, size)
    doc = parse_json(data, f"package {digest[7:19]}", ManifestError)
    # Every field read of the record is of its type before the layout rules read it.
    shapes.conform(doc, shapes.PACKAGE_RECORD, f"package record {digest[7:19]}", ManifestError, HINT_SERVER)
    try:
        doc = check_record(doc)
    except ManifestError as exc:
        raise ManifestError(exc.message, hint=HINT_SERVER) from None
    signed_by = check_signatures(digest, [] if signatures is None else signatures, list(trusted or []),
                                 required=required, allow_unsigned=allow_unsigned)
    out = destination(Path(dest))
    files = [{"name": f["path"], "digest": f["digest"], "size": f["size"]} for f in doc["files"]]
    # As an artifact's files: a large variant in parallel ranges, files already in place kept.
    resumed, downloaded, kept = fetch_and_place(client, out, files, connections=connections,
                                                directories=doc["directories"])
    return InstallResult(digest, out / MANIFEST, [out / safe_relative(f["name"]) for f in files],
                         sum(f["size"] for f in files), resumed, signed_by, downloaded, kept)


def install_package(server: str, token: str | None, ref: str, *, dest: str | os.PathLike[str],
                    trusted_keys: list[str] | None = None, require_signature: bool = False,
                    allow_unsigned: bool = False, timeout: float = 60.0, connections: int = CONNECTIONS
                    ) -> InstallResult:
    """``farm install --package NAME:TAG``: the newest ORT model package made of NAME:TAG's
    current model (``GET /v1/packages?ref=``, a read token: it makes nothing), installed as
    ``install_package_files`` does."""
    client = Client(server, token, timeout=timeout)
    answer = shapes.conform(client.json("GET", "/v1/packages", ref=ref), shapes.PACKAGE_ANSWER, "the package answer",
                            ServerError, HINT_SERVER)
    return install_package_files(client, answer["digest"], answer["record_size"], Path(dest),
                                 trusted=trusted_keys or [], signatures=answer.get("signatures", []),
                                 required=require_signature, allow_unsigned=allow_unsigned, connections=connections)
