"""Large-blob put/get through S3BlobStore vs raw boto3, on the same SeaweedFS, in the same run.

Writes a file of ``--size-mib`` random bytes to disk (hashed once, not timed), starts a private
SeaweedFS, then runs every phase in its own child process so that each peak RSS belongs to that
phase alone (VmHWM of the child; its ``ru_maxrss`` is kept in the JSON but starts at the
spawning parent's high-water mark, see ``worker``):

    store put     S3BlobStore.put_stream(file, expected=digest)
    store get     S3BlobStore.open(digest), read in 1 MiB chunks, sha256 verified
    boto3 put     upload_fileobj, TransferConfig with the store's part size and 1 thread
    boto3 put (default config)   upload_fileobj with boto3's default TransferConfig
    boto3 get     get_object, Body read in 1 MiB chunks, sha256 verified

Both use the store's botocore Config (no CRC checksums, path addressing). Time ratios are
against the raw boto3 phase of the same direction measured in this run; RSS is also shown over
an idle child that only imported the modules (and one that also built the clients). Prints a
table and writes JSON to bench/out/store.json.

    python bench/store.py                  # 2 GiB
    python bench/store.py --size-mib 256 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MIB = 1024 * 1024
READ_CHUNK = MIB
BUCKET = "ctxfarm-bench"

# (phase, direction, label); the first phase of each direction with "boto3" is its baseline.
PHASES = [
    ("store-put", "put", "S3BlobStore.put_stream"),
    ("boto3-put", "put", "boto3 upload_fileobj (same part size, 1 thread)"),
    ("boto3-put-default", "put", "boto3 upload_fileobj (default TransferConfig)"),
    ("store-get", "get", "S3BlobStore.open + read(1 MiB)"),
    ("boto3-get", "get", "boto3 get_object + Body.read(1 MiB)"),
]
BASELINE = {"put": "boto3-put", "get": "boto3-get"}


# ---- child side -------------------------------------------------------------------------------

def _botocore_config() -> Any:
    from botocore.config import Config

    # The same Config S3BlobStore builds for itself (registry/store/s3.py), so the comparison is
    # of the streaming code, not of checksum or addressing settings.
    return Config(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        s3={"addressing_style": "path"},
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
    )


def _raw_key(phase: str, prefix: str, digest: str) -> str:
    return f"{prefix}/{phase}/{digest.removeprefix('sha256:')}"


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One phase in this (child) process; returns seconds, bytes and this process's peak RSS."""
    import resource

    import boto3
    from boto3.s3.transfer import TransferConfig

    from registry.store.s3 import S3BlobStore

    phase, digest, part = args.worker, args.digest, args.part_mib * MIB
    seconds = 0.0
    nbytes = 0
    if phase == "idle-clients":
        S3BlobStore(BUCKET, args.prefix, endpoint=args.endpoint, part_size=part)
        boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1", config=_botocore_config())
    elif phase.startswith("store-"):
        store = S3BlobStore(BUCKET, args.prefix, endpoint=args.endpoint, part_size=part)
        if phase == "store-put":
            t0 = time.perf_counter()
            with open(args.file, "rb") as f:
                info = store.put_stream(f, expected=digest)
            seconds = time.perf_counter() - t0
            nbytes = info.size
        else:
            h = hashlib.sha256()
            t0 = time.perf_counter()
            with store.open(digest) as r:
                while chunk := r.read(READ_CHUNK):
                    h.update(chunk)
                    nbytes += len(chunk)
            seconds = time.perf_counter() - t0
            if "sha256:" + h.hexdigest() != digest:
                raise SystemExit(f"{phase}: digest mismatch")
    elif phase.startswith("boto3-"):
        client = boto3.client("s3", endpoint_url=args.endpoint, region_name="us-east-1", config=_botocore_config())
        if phase.startswith("boto3-put"):
            key = _raw_key(phase, args.prefix, digest)
            if phase == "boto3-put":
                config = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=1)
            else:
                config = TransferConfig()
            t0 = time.perf_counter()
            with open(args.file, "rb") as f:
                client.upload_fileobj(f, BUCKET, key, Config=config)
            seconds = time.perf_counter() - t0
            nbytes = os.path.getsize(args.file)
        else:
            h = hashlib.sha256()
            t0 = time.perf_counter()
            body = client.get_object(Bucket=BUCKET, Key=_raw_key("boto3-put", args.prefix, digest))["Body"]
            try:
                while chunk := body.read(READ_CHUNK):
                    h.update(chunk)
                    nbytes += len(chunk)
            finally:
                body.close()
            seconds = time.perf_counter() - t0
            if "sha256:" + h.hexdigest() != digest:
                raise SystemExit(f"{phase}: digest mismatch")
    elif phase != "idle-import":
        raise SystemExit(f"unknown phase {phase}")
    # Linux reports ru_maxrss in KiB. It is carried across execve: a child's ru_maxrss starts at
    # the high-water mark of the process that spawned it (measured: a 300 MiB parent gives every
    # child >= 300 MiB). VmHWM belongs to this process's own address space, so it is the peak.
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"phase": phase, "seconds": seconds, "bytes": nbytes, "peak_rss": _vm_hwm() or maxrss,
            "ru_maxrss": maxrss}


def _vm_hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ---- parent side ------------------------------------------------------------------------------

def make_source(path: Path, size: int) -> tuple[str, float]:
    """Random bytes written in 16 MiB chunks (never the whole file in memory).

    Returns the digest and the seconds spent hashing alone (what put_stream adds over boto3)."""
    h = hashlib.sha256()
    hashing = 0.0
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(16 * MIB, left))
            t0 = time.perf_counter()
            h.update(chunk)
            hashing += time.perf_counter() - t0
            f.write(chunk)
            left -= len(chunk)
    return "sha256:" + h.hexdigest(), hashing


def warm_up(client: Any, part: int) -> None:
    """Bucket, volume assignment and filer paths exist before the first timed phase (untimed)."""
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    key = "warmup/blob"
    upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = []
    for number in range(1, 9):
        etag = client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=number,
                                  Body=os.urandom(part))["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
    while body.read(READ_CHUNK):
        pass
    client.delete_object(Bucket=BUCKET, Key=key)


def rotated(items: list[Any], r: int) -> list[Any]:
    """Round r starts at a different phase, so no phase is always first (or always after another)."""
    k = r % len(items)
    return items[k:] + items[:k]


def run_child(phase: str, common: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", phase, *common],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {phase} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def delete_round(client: Any, prefix: str) -> None:
    """Drop a round's objects so SeaweedFS disk stays at about one copy per phase."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def stop(svc: Any) -> None:
    """svc.stop(), and SIGKILL to its process group if that is interrupted (a second Ctrl-C while
    weed takes its time over SIGTERM would otherwise leave it running on a deleted directory)."""
    try:
        svc.stop()
    except BaseException:
        if svc.proc is not None and svc.proc.poll() is None:
            try:
                os.killpg(svc.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            svc.proc.wait()
        raise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=2048, help="blob size in MiB (default 2048 = 2 GiB)")
    ap.add_argument("--part-mib", type=int, default=16, help="part size for the store and boto3 (default 16)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of all phases; seconds are medians")
    ap.add_argument("--no-default-config", action="store_true", help="skip the boto3 default-TransferConfig put")
    ap.add_argument("--tmp", default=None, help="where the source file and SeaweedFS data go (default: $TMPDIR)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--digest", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if not args.worker:
        # SIGTERM unwinds like Ctrl-C, so the finally blocks still stop what this run started.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Any credentials do for SeaweedFS without an identity config; children inherit them.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "ctxfarm")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "ctxfarm")
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    import boto3

    from infra.devfarm.services import start_seaweedfs

    phases = [p for p in PHASES if not (args.no_default_config and p[0] == "boto3-put-default")]
    size = args.size_mib * MIB
    results: dict[str, list[dict[str, Any]]] = {p[0]: [] for p in phases}
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-store-", dir=args.tmp) as tmp:
        src = Path(tmp) / "source.bin"
        t0 = time.perf_counter()
        digest, hash_s = make_source(src, size)
        print(f"source: {args.size_mib} MiB on disk, {digest[:19]}, written and hashed in "
              f"{time.perf_counter() - t0:.1f} s (not timed below; sha256 alone {hash_s:.2f} s)", flush=True)
        svc = start_seaweedfs(Path(tmp) / "weed")
        try:
            common = ["--endpoint", svc.url, "--file", str(src), "--digest", digest, "--part-mib", str(args.part_mib)]
            idle = {name: run_child(name, common) for name in ("idle-import", "idle-clients")}
            admin = boto3.client("s3", endpoint_url=svc.url, region_name="us-east-1", config=_botocore_config())
            warm_up(admin, args.part_mib * MIB)
            puts = [p[0] for p in phases if p[1] == "put"]
            gets = [p[0] for p in phases if p[1] == "get"]
            for r in range(args.repeat):
                prefix = f"round{r}"
                for phase in rotated(puts, r) + rotated(gets, r):
                    res = run_child(phase, [*common, "--prefix", prefix])
                    if res["bytes"] != size:
                        raise RuntimeError(f"{phase} moved {res['bytes']} bytes, expected {size}")
                    results[phase].append(res)
                    print(f"  round {r + 1}/{args.repeat} {phase:18s} {res['seconds']:8.2f} s "
                          f"peak RSS {res['peak_rss'] / MIB:7.1f} MiB", flush=True)
                delete_round(admin, prefix)
        finally:
            stop(svc)

    seconds = {p: statistics.median(x["seconds"] for x in results[p]) for p, _, _ in phases}
    idle_rss = idle["idle-import"]["peak_rss"]
    rows = []
    for phase, direction, label in phases:
        secs = seconds[phase]
        peak = max(x["peak_rss"] for x in results[phase])
        rows.append({
            "phase": phase, "direction": direction, "label": label, "seconds": secs,
            "mib_per_s": args.size_mib / secs,
            "time_x_boto3": secs / seconds[BASELINE[direction]],
            "peak_rss_mib": peak / MIB, "rss_over_idle_mib": (peak - idle_rss) / MIB,
            "ru_maxrss_mib": max(x["ru_maxrss"] for x in results[phase]) / MIB,
            "runs": [x["seconds"] for x in results[phase]],
        })

    print(f"\nblob {args.size_mib} MiB, part {args.part_mib} MiB, read chunk 1 MiB, "
          f"{args.repeat} round(s) (seconds = median), SeaweedFS on loopback")
    print(f"{'phase':49s} {'seconds':>8s} {'min-max s':>13s} {'MiB/s':>8s} {'time x boto3':>13s} "
          f"{'peak RSS MiB':>13s} {'over idle':>10s}")
    for row in rows:
        spread = f"{min(row['runs']):.2f}-{max(row['runs']):.2f}"
        print(f"{row['label']:49s} {row['seconds']:8.2f} {spread:>13s} {row['mib_per_s']:8.1f} "
              f"{row['time_x_boto3']:13.2f} {row['peak_rss_mib']:13.1f} {row['rss_over_idle_mib']:10.1f}")
    for name, what in (("idle-import", "idle child (imports only)"),
                       ("idle-clients", "idle child (imports + both clients built)")):
        print(f"{what:49s} {'':8s} {'':13s} {'':8s} {'':13s} {idle[name]['peak_rss'] / MIB:13.1f} "
              f"{(idle[name]['peak_rss'] - idle_rss) / MIB:10.1f}")
    print("time x boto3: phase seconds / raw boto3 seconds of the same direction, this run "
          "(put: 1-thread upload_fileobj; get: get_object)")
    print(f"sha256 of the whole blob alone (put_stream hashes inline, boto3 does not): {hash_s:.2f} s "
          f"= {hash_s / seconds['boto3-put']:.2f} x boto3 put")

    import botocore

    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "store.json").write_text(json.dumps({
        "size_mib": args.size_mib, "part_mib": args.part_mib, "read_chunk_mib": READ_CHUNK // MIB,
        "repeat": args.repeat, "baseline": BASELINE, "rows": rows, "sha256_seconds": hash_s,
        "idle_rss_mib": {k: v["peak_rss"] / MIB for k, v in idle.items()},
        "env": {"python": platform.python_version(), "boto3": boto3.__version__, "botocore": botocore.__version__,
                "cpus": os.cpu_count()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
