"""Blob stores, chosen by URL: the BlobStore protocol (base), LocalBlobStore (``file:///dir``) and
S3BlobStore (``s3://bucket/prefix?endpoint=http://...``), each translating its errors at the boundary.
Imports only farm.core (and boto3 inside s3); nothing else in registry/ or above."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from farm.core.errors import ConfigError
from registry.store.base import BlobInfo, BlobStore

__all__ = ["BlobInfo", "BlobStore", "open_store"]


def open_store(url: str) -> BlobStore:
    if url.startswith("file://") or "://" not in url:
        from registry.store.local import LocalBlobStore

        # A path, not parsed as a URL: any character a directory name may hold is fine here.
        return LocalBlobStore(Path(url.removeprefix("file://")))
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        from registry.store.s3 import S3BlobStore

        return S3BlobStore.from_url(url)
    raise ConfigError(f"unsupported store URL {url!r}", hint="use file:///path or s3://bucket/prefix?endpoint=...")
