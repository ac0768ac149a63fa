"""S3BlobStore: any S3-compatible service (AWS, MinIO, SeaweedFS) through boto3.

``s3://BUCKET/PREFIX?endpoint=http://host:port&region=us-east-1`` ; credentials come from the
usual AWS sources (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, profiles, instance roles).

Uploads stream in parts with the sha256 computed on the way; a blob becomes visible only after
its digest is verified: with a known digest the parts go straight to the final key and the
multipart upload is completed only on a match (S3 shows nothing before CompleteMultipartUpload);
with an unknown digest they go to ``uploads/<uuid>`` and are copied server-side once the digest
is known. Memory stays at about one part whatever the blob size. botocore errors stop here.

A blob of one part (< PART_SIZE) that zstd shrinks by at least a tenth is stored compressed:
``Content-Encoding: zstd`` on the object, its own size in the ``ctxfarm-size`` metadata. Digests,
sizes and every reader see the blob itself (``open`` decodes, ``stat`` answers its own size);
only ``iter_blobs`` (a listing) and a presigned URL see the stored bytes. Measured on SeaweedFS:
the store spends ~10 ms of CPU per MB put whatever the content, and context binaries of the light
test models shrink 70-160x (``?compress=0`` in the URL turns it off).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlparse

from farm.core.errors import BlobNotFound, ConfigError, DigestMismatchError, StorageError, StorageUnavailable
from farm.core.settings import parse_bool
from registry.store.base import BlobInfo, StoredCompressed, blob_key, check_digest, foreign_entry

PART_SIZE = 16 * 1024 * 1024  # memory per upload is about one part
COMPRESS_MIN = 64 * 1024  # smaller blobs are stored as they are
COMPRESS_KEEP = 0.9  # stored compressed only when that saves at least a tenth
COMPRESS_SAMPLE = 256 * 1024  # a larger blob is tried on this much of its middle first
ZSTD_LEVEL = 3
SIZE_META = "ctxfarm-size"  # a compressed object's own size (x-amz-meta-ctxfarm-size)
RANGE_SIZE = 32 * 1024 * 1024  # a large blob is read as ranges of this size ...
RANGE_STREAMS = 4  # ... this many at once (memory: about this many ranges)
COPY_PART_SIZE = 1024 * 1024 * 1024
MAX_SINGLE_COPY = 5 * 1024 * 1024 * 1024


def _read_full(stream: BinaryIO, n: int) -> bytes:
    """Read up to n bytes (fewer only at EOF): sockets and pipes return short reads."""
    chunks = []
    left = n
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class S3BlobStore:
    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str | None = None, region: str | None = None,
                 client: Any = None, create_bucket: bool = True, part_size: int = PART_SIZE,
                 max_attempts: int = 5, compress: bool = True):
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ModuleNotFoundError:
                from farm.core.extras import install_hint

                raise ConfigError("boto3 is needed for an s3:// store", hint=install_hint("s3")) from None
            config = Config(
                # boto3 >= 1.36 sends CRC checksums by default; several S3-compatible stores
                # reject them. Our own sha256 is the integrity check.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                # Over plain http botocore otherwise hashes every body again to sign it: a
                # second sha256 pass per upload part. The upload is checked against its digest
                # here, and every read of a blob verifies it (measured: 1.5 GiB into a local
                # SeaweedFS in 12-13 s against 15-19 s).
                s3={"addressing_style": "path", "payload_signing_enabled": False},
                retries={"max_attempts": max_attempts, "mode": "standard"},
                connect_timeout=10,
                read_timeout=120,
            )
            client = boto3.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config)
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.part_size = part_size
        self.compress = compress
        self.url = f"s3://{bucket}/{self.prefix}" + (f"?endpoint={endpoint}" if endpoint else "")
        if create_bucket:
            self._ensure_bucket()

    @classmethod
    def from_url(cls, url: str) -> S3BlobStore:
        parsed = urlparse(url)
        if not parsed.netloc:
            raise ConfigError(f"store URL {url!r} names no bucket", hint="s3://BUCKET/PREFIX?endpoint=http://...")
        q = parse_qs(parsed.query)
        compress = parse_bool(f"store URL {url!r}: compress", q.get("compress", [None])[0], default=True)
        try:
            retries = int(q.get("retries", ["5"])[0])
        except ValueError:
            raise ConfigError(f"store URL {url!r}: retries must be a number",
                              hint="s3://BUCKET/PREFIX?endpoint=http://...&retries=5") from None
        return cls(parsed.netloc, parsed.path, endpoint=q.get("endpoint", [None])[0],
                   region=q.get("region", [None])[0], max_attempts=retries,
                   compress=compress)

    # ---- keys and errors -----------------------------------------------------------------------

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    @contextmanager
    def _errors(self, what: str, digest: str | None = None) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

        try:
            yield
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                raise BlobNotFound(f"blob {digest} not in {self.url}") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403") or status == 403:
                raise StorageUnavailable(f"{what}: access denied by {self.url} ({code})") from None
            if status is not None and status >= 500:
                raise StorageUnavailable(f"{what}: {self.url} answered {status} {code}") from None
            raise StorageError(f"{what} failed on {self.url}: {code} {exc}") from None
        except (EndpointConnectionError, NoCredentialsError) as exc:
            raise StorageUnavailable(f"{what}: {exc}") from None
        except BotoCoreError as exc:
            raise StorageUnavailable(f"{what}: {exc}") from None

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError

        with self._errors("opening the bucket"):
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                    raise
                try:
                    self.client.create_bucket(Bucket=self.bucket)
                except ClientError as exc2:
                    if exc2.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou",
                                                                           "BucketAlreadyExists"):
                        raise

    # ---- BlobStore ------------------------------------------------------------------------------

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        if expected is not None:
            check_digest(expected)
        h = hashlib.sha256()
        first = _read_full(stream, self.part_size)
        h.update(first)
        if len(first) < self.part_size:
            digest = "sha256:" + h.hexdigest()
            self._check(expected, digest)
            packed = _pack(first) if self.compress else None
            extra: dict[str, Any] = {} if packed is None else {
                "ContentEncoding": "zstd", "Metadata": {SIZE_META: str(len(first))}}
            with self._errors("uploading a blob", digest):
                self.client.put_object(Bucket=self.bucket, Key=self._key(blob_key(digest)),
                                       Body=first if packed is None else packed, **extra)
            return BlobInfo(digest, len(first), encoding=None if packed is None else "zstd")
        key = self._key(blob_key(expected)) if expected else self._key(f"uploads/{uuid.uuid4().hex}")
        parts = self._parts(first, stream, h)
        del first  # the generator owns it now: memory stays at about one part
        digest, size = self._multipart(key, parts, h, expected)
        if expected is None:
            # Digest known only now: move the verified upload to its content address.
            try:
                self._copy(key, self._key(blob_key(digest)), size)
            finally:
                with self._errors("removing a temporary upload"):
                    self.client.delete_object(Bucket=self.bucket, Key=key)
        return BlobInfo(digest, size)

    def _check(self, expected: str | None, digest: str) -> None:
        if expected is not None and digest != expected:
            raise DigestMismatchError(f"upload does not match its digest: expected {expected}, got {digest}")

    def _parts(self, first: bytes, stream: BinaryIO, h: Any) -> Iterator[bytes]:
        """Yield the already-read first part, then the rest, hashing as it reads. Each part is
        dropped before the next is read."""
        chunk, first = first, b""
        while chunk:
            yield chunk
            chunk = b""
            chunk = _read_full(stream, self.part_size)
            h.update(chunk)

    def _multipart(self, key: str, chunks: Iterator[bytes], h: Any, expected: str | None) -> tuple[str, int]:
        with self._errors("starting a multipart upload"):
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        parts = []
        size = 0
        completed = False
        try:
            for number, chunk in enumerate(chunks, start=1):
                with self._errors("uploading a part"):
                    etag = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                   PartNumber=number, Body=chunk)["ETag"]
                parts.append({"PartNumber": number, "ETag": etag})
                size += len(chunk)
                del chunk
            digest = "sha256:" + h.hexdigest()
            self._check(expected, digest)  # mismatch: abort below, nothing becomes visible
            with self._errors("completing a multipart upload"):
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                      MultipartUpload={"Parts": parts})
            completed = True
            return digest, size
        finally:
            if not completed:
                try:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
                except Exception:  # best effort; gc aborts stale uploads later
                    pass

    def _copy(self, src: str, dst: str, size: int) -> None:
        source = {"Bucket": self.bucket, "Key": src}
        with self._errors("copying a blob"):
            if size <= MAX_SINGLE_COPY:
                self.client.copy_object(Bucket=self.bucket, Key=dst, CopySource=source)
                return
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=dst)["UploadId"]
            parts = []
            for number, start in enumerate(range(0, size, COPY_PART_SIZE), start=1):
                end = min(start + COPY_PART_SIZE, size) - 1
                r = self.client.upload_part_copy(Bucket=self.bucket, Key=dst, UploadId=upload_id, PartNumber=number,
                                                 CopySource=source, CopySourceRange=f"bytes={start}-{end}")
                parts.append({"PartNumber": number, "ETag": r["CopyPartResult"]["ETag"]})
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=dst, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})

    @contextmanager
    def open(self, digest: str) -> Iterator[BinaryIO]:
        with self._errors("reading a blob", digest):
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(blob_key(digest)))
        body = resp["Body"]
        try:
            raw = _Reader(body, self)
            size = _own_size(resp, digest)
            yield (raw if size is None else _Unpacked(raw, size, digest))  # type: ignore[misc]
        finally:
            body.close()

    def read_ranges(self, digest: str, size: int) -> Iterator[bytes]:
        """The blob's bytes in order, read as ranged GETs ``RANGE_STREAMS`` at a time: one stream
        is bound by each request's round trips (measured: 1.5 GiB from a local SeaweedFS, verified,
        in 3.5-6.6 s this way against 7.4-10.5 s as one GET). For a blob stored as it is, of the
        ``size`` its caller recorded; raises ``StoredCompressed`` before yielding anything when it
        is stored compressed (read it with ``open``). The caller verifies what it gets."""
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        key = self._key(blob_key(check_digest(digest)))

        def get(start: int) -> bytes:
            end = min(start + RANGE_SIZE, size) - 1
            with self._errors("reading a blob", digest):
                resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}")
                if _own_size(resp, digest) is not None:
                    resp["Body"].close()
                    raise StoredCompressed(digest)
                total = str(resp.get("ContentRange") or "").rpartition("/")[2]
                data: bytes = resp["Body"].read()
            if total != str(size) or len(data) != end - start + 1:
                raise DigestMismatchError(f"blob {digest} is not the {size} bytes recorded for it (the store "
                                          f"holds {total or 'an unknown size'})",
                                          hint="the stored blob was altered or corrupted; run `farm registry verify`")
            return data

        starts = iter(range(0, size, RANGE_SIZE))
        with ThreadPoolExecutor(RANGE_STREAMS, thread_name_prefix="ctxfarm-s3-range") as pool:
            pending = deque(pool.submit(get, start) for _, start in zip(range(RANGE_STREAMS), starts, strict=False))
            try:
                while pending:
                    data = pending.popleft().result()
                    start = next(starts, None)
                    if start is not None:
                        pending.append(pool.submit(get, start))
                    yield data
            finally:
                for f in pending:
                    f.cancel()

    def stat(self, digest: str) -> BlobInfo:
        with self._errors("reading blob metadata", digest):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(blob_key(digest)))
        size = _own_size(head, digest)
        return BlobInfo(digest, int(head["ContentLength"]) if size is None else size, head.get("LastModified"),
                        encoding=None if size is None else "zstd")

    def delete(self, digest: str) -> None:
        with self._errors("deleting a blob", digest):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(blob_key(check_digest(digest))))

    def iter_blobs(self) -> Iterator[BlobInfo]:
        base = self._key("blobs/sha256/")
        with self._errors("listing blobs"):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(base):]
                    sub, _, name = rel.partition("/")
                    if len(name) == 64 and sub == name[:2] and all(c in "0123456789abcdef" for c in name):
                        yield BlobInfo("sha256:" + name, int(obj["Size"]), obj.get("LastModified"))
                    else:
                        yield foreign_entry("blobs/sha256/" + rel, int(obj["Size"]))

    def presign(self, digest: str, ttl_seconds: int = 3600) -> str:
        """A URL that GETs the blob without credentials until it expires."""
        with self._errors("presigning", digest):
            url: str = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(blob_key(check_digest(digest)))},
                ExpiresIn=int(ttl_seconds))
        return url

    def abort_stale_uploads(self, older_than: datetime) -> int:
        """Abort multipart uploads and temp objects left by crashed uploaders (gc)."""
        n = 0
        with self._errors("listing uploads"):
            resp = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self._key(""))
            for up in resp.get("Uploads", []):
                if up["Initiated"] < older_than:
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
                    n += 1
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self._key("uploads/")):
                for obj in page.get("Contents", []):
                    if obj["LastModified"] < older_than:
                        self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
                        n += 1
        return n


def _pack(data: bytes) -> bytes | None:
    """zstd of ``data`` when it is worth storing instead (None: store the blob as it is)."""
    if len(data) < COMPRESS_MIN:
        return None
    try:
        import zstandard
    except ModuleNotFoundError:  # an install without it stores blobs as they are
        return None
    z = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    if len(data) > 4 * COMPRESS_SAMPLE:
        # Bytes that will not shrink by a tenth (measured: random-normal fp16 weights 8%, int8
        # 12.5%; random 0%): a sample says so for a fraction of a ms, not the whole blob's worth
        # (zstd level 3 on such bytes here: 460-900 MB/s).
        mid = (len(data) - COMPRESS_SAMPLE) // 2
        if len(z.compress(data[mid:mid + COMPRESS_SAMPLE])) > COMPRESS_SAMPLE * COMPRESS_KEEP:
            return None
    packed: bytes = z.compress(data)
    return packed if len(packed) <= len(data) * COMPRESS_KEEP else None


def _own_size(resp: dict[str, Any], digest: str) -> int | None:
    """The blob's own size when the object holds it compressed (None: stored as it is)."""
    if resp.get("ContentEncoding") != "zstd":
        return None
    size = (resp.get("Metadata") or {}).get(SIZE_META, "")
    if not size.isdigit():
        raise DigestMismatchError(f"blob {digest} is stored compressed without its size (altered in the store)")
    return int(size)


class _Unpacked:
    """Decodes a zstd object as it is read; never more than the recorded size (a tampered
    object cannot make a reader write more than the blob it claims to be)."""

    def __init__(self, raw: _Reader, size: int, digest: str):
        try:
            import zstandard
        except ModuleNotFoundError:
            from farm.core.extras import install_hint

            raise ConfigError(f"blob {digest} is stored zstd-compressed and zstandard is not installed",
                              hint=install_hint("s3")) from None
        self._error = zstandard.ZstdError
        self._reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)  # type: ignore[arg-type]
        self._left = size
        self._digest = digest

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        if n == 0:
            return b""
        try:
            data: bytes = self._reader.read(min(n, self._left + 1))
        except self._error as exc:
            raise DigestMismatchError(f"blob {self._digest}: its stored bytes do not decode ({exc})") from None
        if len(data) > self._left:
            raise DigestMismatchError(f"blob {self._digest} decodes to more than its recorded size")
        self._left -= len(data)
        return data


class _Reader:
    """File-like view of a streamed GET body with errors translated."""

    def __init__(self, body: Any, store: S3BlobStore):
        self._body = body
        self._store = store

    def read(self, n: int = -1) -> bytes:
        with self._store._errors("reading a blob"):
            data: bytes = self._body.read(None if n is None or n < 0 else n)
        return data
