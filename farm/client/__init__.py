"""The device (and pipeline) client of the HTTP service: the Python standard library only, so a
device installs it alone (``pip install ctxfarm-client``, built from ``infra/client/``: no onnx,
SQLAlchemy or EPs; ``cryptography`` only when signatures are checked).

    from farm.client import install
    ctx_model = install("http://farm:8080", token, "super-res:stable", soc="SM8650", qnn="2.51.0",
                        dest="/data/models/super-res").ctx_model

A device trusts no server: everything a service (or a man in the middle) sends is hostile input
until checked (docs/security.md, "Device client"). ``install``:

1. asks ``/v1/resolve`` and reads at most ``MAX_ANSWER_BYTES`` of the answer; holds it to its
   shape (``shapes``: the type of every field it reads, before any is used) and binds the
   answer to the question (the model it named, the backend, the SoC or GPU, a toolchain the
   runtime can load);
2. fetches the manifest by its digest (``/v1/blobs/<artifact>``, never a URL from the answer),
   stops at its declared size, checks the bytes hash to the artifact digest, its shape (the
   type of every field read) and every file name, digest and size (``farm.core.untrusted``),
   and that it says what the answer said; with trusted keys, requires a signature by one of
   them over that digest;
3. takes each file --dest already holds at its name and size (a hard link, verified like a
   download: a re-install of an up-to-date destination fetches nothing and changes nothing);
   downloads the others with resume into a partial directory named by the file's checked
   digest, a large file in ranges over ``connections`` connections at once (each range asked
   exactly and accepted only as exactly that range; what was written recorded as it lands, so
   an interruption loses nothing), stopping at its declared size; verifies size and sha256;
4. places the files atomically (``farm.core.placement``), each path checked to stay under --dest.

Redirects are followed to http(s) only (never https -> http), at most ``MAX_REDIRECTS``; the
bearer token never follows one. Every malformed answer is ``server-error`` (the answer) or
``bad-manifest`` (the manifest, a package record); content that does not match its digest is
``digest-mismatch``.

One module per job: ``transport`` (requests, redirects, capped reads, error answers),
``shapes`` (the shape every answer must have), ``answers`` (the question, the answer and
manifest bound to it, signatures), ``ranges`` and ``downloads`` (resumable, ranged downloads by
digest), ``placing`` (staging, links, the atomic swap, up-to-date detection), ``install``,
``packages`` (ORT model packages), ``uploads`` and ``service`` (the pipeline's side: uploads,
``Client``, ``wait_release``) and ``cli`` (``ctxfarm-install``, ``python -m farm.client``).
"""

from __future__ import annotations

from farm.client.answers import (
    MAX_MANIFEST_BYTES,
    MAX_SIGNATURES,
    Question,
    check_answer,
    check_manifest_binding,
    check_signatures,
    checked_manifest,
    question,
)
from farm.client.cli import detect_qnn, main
from farm.client.downloads import CONNECTIONS, HINT_DIGEST, MAX_CONNECTIONS, RANGE_PART, RANGED_FROM
from farm.client.install import InstallResult, install
from farm.client.packages import install_package, install_package_files
from farm.client.placing import PARTIAL, _holds_exactly, _take_placed, fetch_and_place
from farm.client.ranges import MAX_RANGES_BYTES, RANGES_SUFFIX, kept_bytes, merge_ranges, plan_ranges
from farm.client.ranges import kept_prefix as _kept_prefix
from farm.client.ranges import load_ranges as _load_ranges
from farm.client.service import Client, wait_release
from farm.client.transport import CHUNK, HINT_RESUME, HINT_SERVER, MAX_ANSWER_BYTES, MAX_ERROR_BYTES, MAX_REDIRECTS
from farm.client.transport import Stream as _Stream
from farm.client.uploads import tar_parts as _tar_parts

# The constants are re-exported for reading; a test that changes one patches the module that
# reads it (farm.client.downloads for RANGE_PART and RANGED_FROM).
__all__ = [
    "CHUNK", "CONNECTIONS", "HINT_DIGEST", "HINT_RESUME", "HINT_SERVER", "MAX_ANSWER_BYTES", "MAX_CONNECTIONS",
    "MAX_ERROR_BYTES", "MAX_MANIFEST_BYTES", "MAX_RANGES_BYTES", "MAX_REDIRECTS", "MAX_SIGNATURES", "PARTIAL",
    "RANGED_FROM", "RANGES_SUFFIX", "RANGE_PART", "Client", "InstallResult", "Question", "_Stream", "_holds_exactly",
    "_kept_prefix", "_load_ranges", "_take_placed", "_tar_parts", "check_answer", "check_manifest_binding",
    "check_signatures", "checked_manifest", "detect_qnn", "fetch_and_place", "install", "install_package",
    "install_package_files", "kept_bytes", "main", "merge_ranges", "plan_ranges", "question", "wait_release",
]
