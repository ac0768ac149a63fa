"""``ctxfarm-agent run``: lease a verification job, install its artifact as ``farm install`` does
(resolved for this device, verified, swapped in atomically), fetch the source model for the CPU
reference, measure through the runner registry, and post the report signed with the device's key.

Every name and digest in a lease comes from the service and is checked before it is used: the
artifact resolve answers must be the job's, the model's file names stay under the work directory.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError, ServerError, UsageError
from farm.core.signed_reports import canonical, message
from workers.agent.identity import Identity

LEASE_WAIT_S = 20.0  # a long poll: the service answers at once when a job is there
BACKOFF_MAX_S = 60.0  # a running agent asks an unreachable service again after 1, 2, 4 ... 60 s
REPORT_TRIES = 5  # a signed report is posted again when the service did not answer (it is idempotent)
RUNS = 10  # steady-state runs; the median is reported
INPUTS = "seeded:0"  # what the runs are fed without samples (workers.qnn.accuracy.seeded_inputs, seed 0)
MAX_SAMPLES = 64 * 1024 * 1024  # the service's own cap on a model's sample inputs (docs/evidence.md)
KINDS = ("context",)  # what this agent runs: one context (groups and genai packages: docs/device-lab.md)
MAX_REFERENCE = 1024 * 1024 * 1024  # a stored CPU reference the agent downloads at most (the farm's bound is lower)


def run(ident: Identity, home: Path, *, once: bool, simulate: list[str], runs: int = RUNS,
        log: Any = sys.stderr) -> int:
    """Take jobs until stopped (``once``: those there are now, then return). Returns how many
    reports were accepted."""
    from workers.agent.wire import call

    if simulate and not ident.simulator:
        raise UsageError(f"--simulate is for simulator agents; {ident.name} is a {ident.soc} device")
    runtime = _runtime()
    done = 0
    backoff = 1.0
    while True:
        payload = {"socs": simulate or None, "runtime": runtime, "wait_s": 0.0 if once else LEASE_WAIT_S,
                   "kinds": list(KINDS)}
        try:
            status, job = call(ident.server, "/v1/device-jobs/lease", ident.token, payload, timeout=LEASE_WAIT_S + 30)
        except ServerError as exc:
            if once:
                raise
            # A service restarting, a network down: an agent running as a service outlives it.
            print(f"ctxfarm-agent: {exc.message}; asking again in {backoff:.0f} s", file=log, flush=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            continue
        backoff = 1.0
        if status == 204 or job is None:
            if once:
                return done
            continue
        job = _checked(job)
        every = max(1.0, float(job.get("lease_s") or 600) / 3)
        renew = partial(call, ident.server, f"/v1/device-jobs/{job['job']}/renew", ident.token, {"nonce": job["nonce"]})
        try:
            with Renewer(renew, every) as renewer:
                body = verify(ident, home, job, runs=runs, runtime=runtime)
        except FarmError as exc:
            # Nothing is reported that was not measured: the job goes back when its lease runs out.
            print(f"ctxfarm-agent: job {job['job']} not run: error[{exc.code}]: {exc.message}", file=log)
            if once:
                continue
            time.sleep(5)  # the same failure would come back at once
            continue
        if renewer.lost is not None:
            print(f"ctxfarm-agent: job {job['job']}: {renewer.lost.message}; not reporting", file=log)
            continue
        text = canonical(body)
        signature = ident.sign(message(text))
        post = partial(call, ident.server, f"/v1/device-jobs/{job['job']}/report", ident.token,
                       {"body": text, "signature": signature})
        if not _post_report(post, log):
            continue
        done += 1
        print(f"ctxfarm-agent: job {job['job']} ({job['soc']}): {body['outcome']}"
              + (f", p50 {body['p50_ms']:.2f} ms, psnr {body['psnr_db']}" if body["outcome"] == "ok" else ""), file=log)


def _post_report(post: Callable[[], Any], log: Any) -> bool:
    """Post a signed report, again while the service does not answer (the same signed report is
    answered with the same row: it counts once). A refusal is final. Whether it was recorded."""
    for attempt in range(REPORT_TRIES):
        try:
            post()
            return True
        except ServerError as exc:
            if attempt == REPORT_TRIES - 1:
                print(f"ctxfarm-agent: the report was not sent: {exc.message}", file=log, flush=True)
                return False
            time.sleep(2.0**attempt)
        except FarmError as exc:
            print(f"ctxfarm-agent: the report was refused: error[{exc.code}]: {exc.message}", file=log, flush=True)
            return False
    return False


class Renewer:
    """Renews a job's lease every ``every`` seconds on a thread of its own while the job runs (a
    large model on a slow device outlasts a lease). ``lost``: the lease went to another agent."""

    def __init__(self, renew: Callable[[], Any], every: float):
        self.renew, self.every = renew, every
        self.stop = threading.Event()
        self.lost: FarmError | None = None
        self.thread = threading.Thread(target=self._run, name="ctxfarm-agent-renew", daemon=True)

    def _run(self) -> None:
        from farm.core.errors import LeaseLostError

        while not self.stop.wait(self.every):
            try:
                self.renew()
            except LeaseLostError as exc:
                self.lost = exc
                return
            except FarmError:
                continue  # the service unreachable for a moment: the lease has two thirds left

    def __enter__(self) -> Renewer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _runtime() -> str | None:
    from workers.backends import qnn_toolchain

    try:
        return qnn_toolchain().version
    except FarmError:
        return None


def _checked(job: Any) -> dict[str, Any]:
    from farm.core.untrusted import check_digest, check_file_name, check_size

    try:
        if not isinstance(job["job"], int) or not isinstance(job["nonce"], str) or len(job["nonce"]) > 64:
            raise TypeError("job, nonce")
        check_digest(job["artifact"], "artifact")
        check_digest(job["model"], "model")
        if not isinstance(job["soc"], str) or not isinstance(job["model_files"], list):
            raise TypeError("soc, model_files")
        for f in job["model_files"]:
            check_file_name(f["path"])
            check_digest(f["digest"])
            check_size(f["size"])
        if job.get("samples") is not None:
            check_digest(job["samples"]["digest"], "samples")
            check_size(job["samples"]["size"], "samples size", limit=MAX_SAMPLES)
        if job.get("reference") is not None:
            check_digest(job["reference"]["digest"], "reference")
            check_size(job["reference"]["size"], "reference size", limit=MAX_REFERENCE)
        if job.get("reference_why") is not None and not isinstance(job["reference_why"], str):
            raise TypeError("reference_why")
        if job.get("kind", "context") not in KINDS:
            raise TypeError(f"kind {str(job.get('kind'))[:40]!r}: this agent runs {', '.join(KINDS)}")
    except (KeyError, TypeError) as exc:
        raise ServerError(f"the lease is not a verification job ({exc})") from None
    return job  # type: ignore[no-any-return]


def verify(ident: Identity, home: Path, job: dict[str, Any], *, runs: int, runtime: str | None) -> dict[str, Any]:
    """Install, fetch the samples and the stored CPU reference (or, without one, the model to compute
    it on this device's CPU), measure; the report body (unsigned)."""
    from farm.client import install
    from farm.core.catalog import load_catalog
    from farm.core.names import inside
    from workers.agent.wire import download
    from workers.backends import measure_context

    if runtime is None:
        raise UsageError("no QNN runtime here (onnxruntime-qnn): nothing to verify with",
                         hint="pip install 'ctxfarm[qnn]'")
    work = home / "work"  # fixed names under the agent's home: nothing from the lease names a path
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    target = load_catalog().get(job["soc"], backend="qnn")
    installed = install(ident.server, ident.token, job["model"], dest=home / "installed", soc=job["soc"], qnn=runtime)
    if installed.artifact != job["artifact"]:
        raise ServerError(f"resolve answered {installed.artifact} for job {job['job']}, which is {job['artifact']}")
    sample = None
    if job.get("samples"):
        sample = work / "samples.npz"  # a fixed name: the digest names the content, not the path
        download(ident.server, ident.token, job["samples"]["digest"], job["samples"]["size"], sample)
    body: dict[str, Any] = {"job": job["job"], "nonce": job["nonce"], "device": ident.name, "artifact": job["artifact"],
                            "soc": job["soc"], "runtime": runtime,
                            "inputs": job["samples"]["digest"] if sample is not None else INPUTS}
    reference = None
    if sample is not None and job.get("reference"):
        # The farm's CPU outputs for these samples: one reference for every device, fetched with the
        # install's verified download (size and sha256 checked before the file is used).
        from farm.client import Client
        from farm.core.errors import DigestMismatchError

        reference, ref = work / "reference.npz", job["reference"]
        body["reference"] = "stored"
        try:
            Client(ident.server, ident.token).download(ref["digest"], reference, size=ref["size"])
        except DigestMismatchError as exc:
            # Never compared against: a reference that is not the one the lease named proves nothing.
            return {**body, "outcome": "fails", "error": f"the stored CPU reference {ref['digest']} was refused: "
                    f"{exc.message[:500]}; nothing was compared against it"}
    model = None
    if reference is None:
        body["reference"] = "device-cpu"
        from farm.core.text import printable

        # The service's words, signed by this device: only printable text (the service refuses the rest).
        body["reference_why"] = printable(str(job.get("reference_why") or "the job names no stored reference"))[:300]
        for f in job["model_files"]:  # the source model, for the CPU reference computed here
            path = inside(work / "model", f["path"])
            path.parent.mkdir(parents=True, exist_ok=True)
            download(ident.server, ident.token, f["digest"], f["size"], path)
            model = model or path
    (work / "measure").mkdir()
    got = measure_context(model, installed.ctx_model, target, work / "measure", runs=runs, sample=sample,
                          reference=reference)
    body["outcome"] = got.get("outcome", "crashed")
    for key in ("load_ms", "first_inference_ms", "p50_ms", "peak_memory_mb", "psnr_db"):
        if isinstance(got.get(key), int | float):
            body[key] = round(float(got[key]), 3)
    if isinstance(got.get("runs"), int):
        body["runs"] = got["runs"]
    if got.get("error"):
        from farm.core.text import printable

        body["error"] = printable(str(got["error"]).replace("\n", " "))[-3000:]
    return body
