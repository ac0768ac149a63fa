"""Accuracy evidence (docs/evidence.md): what running an artifact gave against the CPU reference.

One ``accuracy_results`` row per (artifact, runtime, inputs). ``numerics_key`` hashes what decides
the numbers (model, context bytes, runtime, inputs): an artifact whose context is byte-identical to
one already checked reuses that row instead of another simulator run. The gate (``--min-psnr``)
reads the rows here and names the worst output and its figure.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from farm.core.errors import AccuracyBelowThresholdError, AccuracyUnverifiedError, FarmError
from registry.models import AccuracyResult

SEEDED = "seeded:0"  # the inputs label of deterministic seeded inputs (seed 0)


def numerics_key(model_digest: str, context_digests: Iterable[str], backend: str, runtime: str, inputs: str) -> str:
    h = hashlib.sha256()
    for part in (model_digest, *sorted(context_digests), backend, runtime, inputs):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def summarize(result: dict[str, Any]) -> tuple[float | None, str | None]:
    """(lowest PSNR over the outputs, that output's name) of an ``ok`` run; else (None, None)."""
    if result.get("status") != "ok":
        return None, None
    worst: tuple[float, str] | None = None
    for o in result.get("outputs") or []:
        psnr = o.get("psnr_db")
        if isinstance(psnr, int | float) and math.isfinite(psnr) and (worst is None or psnr < worst[0]):
            worst = (float(psnr), str(o.get("name")))
    return worst if worst is not None else (None, None)


def record(s: Session, artifact_id: int, backend: str, runtime: str, inputs: str, key: str,
           result: dict[str, Any]) -> AccuracyResult:
    """Store a run (replacing an earlier one of the same artifact, runtime and inputs)."""
    s.execute(delete(AccuracyResult).where(AccuracyResult.artifact_id == artifact_id,
                                           AccuracyResult.runtime_backend == backend,
                                           AccuracyResult.runtime_version == runtime,
                                           AccuracyResult.inputs == inputs))
    worst, name = summarize(result)
    row = AccuracyResult(artifact_id=artifact_id, runtime_backend=backend, runtime_version=runtime, inputs=inputs,
                         numerics_key=key, status=result["status"], outputs=list(result.get("outputs") or []),
                         min_psnr_db=worst, worst_output=name, detail=(result.get("detail") or None),
                         run_seconds=_num(result.get("run_seconds")),
                         reference_seconds=_num(result.get("reference_seconds")))
    if row.detail:
        row.detail = row.detail[:4000]
    s.add(row)
    s.flush()
    return row


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def reusable(s: Session, key: str, artifact_id: int) -> AccuracyResult | None:
    """A finished run (``ok`` or ``unverified``: both depend on the bytes only) of another artifact
    with the same numerics; crashes and time-outs are not reused (they may be the host's)."""
    return s.scalar(select(AccuracyResult).where(AccuracyResult.numerics_key == key,
                                                 AccuracyResult.artifact_id != artifact_id,
                                                 AccuracyResult.status.in_(("ok", "unverified")))
                    .order_by(AccuracyResult.recorded_at.desc()).limit(1))


def existing(s: Session, artifact_id: int, backend: str, runtime: str, inputs: str) -> AccuracyResult | None:
    return s.scalar(select(AccuracyResult).where(AccuracyResult.artifact_id == artifact_id,
                                                 AccuracyResult.runtime_backend == backend,
                                                 AccuracyResult.runtime_version == runtime,
                                                 AccuracyResult.inputs == inputs))


def view(row: AccuracyResult) -> dict[str, Any]:
    """A row as `farm show`, resolve, the API and the coverage data show it."""
    from farm.core.times import iso

    return {"runtime": f"{row.runtime_backend}:{row.runtime_version}", "inputs": row.inputs, "status": row.status,
            "min_psnr_db": row.min_psnr_db, "worst_output": row.worst_output, "detail": row.detail,
            "outputs": list(row.outputs or []), "run_seconds": row.run_seconds,
            "reference_seconds": row.reference_seconds, "recorded_at": iso(row.recorded_at)}


def of_artifacts(s: Session, artifact_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Artifact id -> its accuracy views, newest first."""
    out: dict[int, list[dict[str, Any]]] = {}
    if not artifact_ids:
        return out
    for row in s.scalars(select(AccuracyResult).where(AccuracyResult.artifact_id.in_(artifact_ids))
                         .order_by(AccuracyResult.recorded_at.desc())):
        out.setdefault(row.artifact_id, []).append(view(row))
    return out


def headline(views: list[dict[str, Any]]) -> str:
    """One cell: ``78.6 dB`` / ``unverified`` / ``runtime-crashed`` / ``-``."""
    if not views:
        return "-"
    v = views[0]
    if v["status"] == "ok" and v["min_psnr_db"] is not None:
        return f"{v['min_psnr_db']:.1f} dB"
    return str(v["status"])


def gate(view_: dict[str, Any] | None, min_psnr: float, artifact: str) -> FarmError | None:
    """The refusal a ``--min-psnr`` request answers for an artifact's accuracy, or None when every
    output is at or above ``min_psnr`` dB. No evidence or none usable is ``accuracy-unverified``."""
    short = artifact.removeprefix("sha256:")[:12]
    if view_ is None:
        return AccuracyUnverifiedError(f"artifact {short} has no accuracy figure yet",
                                       hint="the check runs after the build; ask again, or drop --min-psnr")
    if view_["status"] != "ok":
        return AccuracyUnverifiedError(
            f"artifact {short}: accuracy {view_['status']}: {(view_.get('detail') or '')[:300]}",
            hint=f"drop --min-psnr to use artifact {short} (built and published) without the check; "
                 "a device report is the only evidence for contexts this runtime cannot run")
    failing = [o for o in view_["outputs"] if not isinstance(o.get("psnr_db"), int | float)
               or o["psnr_db"] < min_psnr]
    if not failing:
        return None
    o = min(failing, key=lambda o: o.get("psnr_db") or 0.0)
    figures = f"PSNR {o.get('psnr_db')} dB, cosine {o.get('cosine')}, max abs error {o.get('max_abs_error')}"
    return AccuracyBelowThresholdError(
        f"output {o.get('name')!r}: {figures} on {view_['runtime']}, below --min-psnr {min_psnr:g}",
        hint=f"artifact {short} is built and published; the HTP runs float models in fp16: check the model for "
             "values beyond fp16's range (65,504) or lower --min-psnr")


# ---- the submitter's sample inputs (an .npz) -------------------------------------------------------

MAX_SAMPLE_BYTES = 64 * 1024 * 1024  # the upload, and the arrays it expands to (each counted)
ONNX_TO_NUMPY = {1: "float32", 10: "float16", 11: "float64", 7: "int64", 6: "int32", 5: "int16", 3: "int8",
                 2: "uint8", 4: "uint16", 9: "bool"}


def model_inputs(model_path: Any) -> list[tuple[str, str | None, list[int | str | None]]]:
    """(name, numpy dtype, dims) of a model's graph inputs (initializers left out); a dim is an
    int, a symbolic name or None. The graph only: external data is not read."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    out: list[tuple[str, str | None, list[int | str | None]]] = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        dims: list[int | str | None] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                        for d in t.shape.dim]
        out.append((inp.name, ONNX_TO_NUMPY.get(t.elem_type), dims))
    return out


MAX_SAMPLE_MEMBERS = 1024  # arrays in one .npz: one per model input
SAMPLES_HINT = "np.savez('inputs.npz', **{input_name: array}): one array per input of the one model"


def check_samples(npz_path: Any, model_path: Any, *, max_bytes: int = MAX_SAMPLE_BYTES) -> list[dict[str, Any]]:
    """Validate an uploaded ``.npz`` against the model's inputs, as any upload: bounded size (the
    file and every array it expands to), at most ``MAX_SAMPLE_MEMBERS`` arrays (counted before
    the directory is parsed: ``farm.core.archives``), ``allow_pickle=False``, one array per input
    with its name, dtype, rank and fixed dims, nothing else; every array read to its end, so a bad
    CRC or a cut member is found. Returns the arrays' (name, dtype, shape). Refusals are
    ``bad-samples`` (``too-large`` past the size)."""
    from pathlib import Path

    import numpy as np

    from farm.core.archives import ZIP_ERRORS, open_zip, reason
    from farm.core.errors import BadSamplesError, TooLargeError

    path = Path(npz_path)
    size = path.stat().st_size
    if size > max_bytes:
        raise TooLargeError(f"the sample inputs are {size} bytes, over {max_bytes}")
    try:
        wanted = model_inputs(model_path)
    except Exception as exc:  # a graph onnx cannot read (or a group's manifest): no inputs to check against
        raise BadSamplesError(f"the model's inputs could not be read to check the samples against: "
                              f"{type(exc).__name__}", hint="sample inputs are for a single .onnx model") from None
    out = []
    with open_zip(path, max_members=MAX_SAMPLE_MEMBERS, error=BadSamplesError, what=".npz (numpy.savez) file",
                  hint=SAMPLES_HINT) as z:
        members = z.infolist()
        if sum(m.file_size for m in members) > max_bytes:
            raise TooLargeError(f"the sample arrays expand to over {max_bytes} bytes")
        names = [m.filename for m in members]
        if any(not n.endswith(".npy") or "/" in n or "\\" in n for n in names):
            raise BadSamplesError(f"the .npz holds members that are not plain arrays: {names[:5]}", hint=SAMPLES_HINT)
        got_names = sorted(n.removesuffix(".npy") for n in names)
        if got_names != sorted(w[0] for w in wanted):
            raise BadSamplesError(f"the sample arrays {got_names[:20]} are not the model's inputs "
                                  f"{sorted(w[0] for w in wanted)[:20]}", hint="one array per model input, named as it")
        for name, dtype, dims in wanted:
            try:
                arr = _read_npy(z, z.getinfo(f"{name}.npy"))
            except ValueError as exc:  # pickled objects, a bad .npy header, too few bytes
                raise BadSamplesError(f"sample {name!r} could not be read as a plain array: {str(exc)[:200]}",
                                      hint=SAMPLES_HINT) from None
            except ZIP_ERRORS as exc:
                raise BadSamplesError(f"sample {name!r} is damaged in the .npz: {reason(exc)}",
                                      hint="the file is corrupt (a bad CRC, cut short): save it again") from None
            if dtype is None or arr.dtype != np.dtype(dtype):
                raise BadSamplesError(f"sample {name!r} is {arr.dtype}, the model's input is {dtype}")
            if arr.ndim != len(dims) or any(isinstance(d, int) and d > 0 and d != n
                                            for d, n in zip(dims, arr.shape, strict=True)):
                raise BadSamplesError(f"sample {name!r} has shape {list(arr.shape)}, the model's input is "
                                      f"{[d if d else '?' for d in dims]}")
            out.append({"name": name, "dtype": str(arr.dtype), "shape": list(arr.shape)})
    return out


def _read_npy(z: Any, info: Any) -> Any:
    """One ``.npy`` member, its header read first: an object dtype (a pickle) or a shape that
    needs more bytes than the member holds is refused before anything is allocated; then read to
    the member's end, where zipfile checks the CRC."""
    import math

    import numpy as np

    fmt = np.lib.format
    with z.open(info) as src:
        version = fmt.read_magic(src)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(src)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(src)
        else:
            raise ValueError(f".npy format version {version} is not read here (1.0 and 2.0 are)")
        if dtype.hasobject:
            raise ValueError("the array holds Python objects (a pickle): plain numeric arrays only")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > info.file_size:
            raise ValueError(f"its header declares {nbytes} bytes of data, the member holds {info.file_size}")
        data = src.read(nbytes)
        if len(data) != nbytes:
            raise ValueError(f"the array is cut short ({len(data)} of {nbytes} bytes)")
        src.read()  # to the member's end: its CRC is checked there
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def record_samples(s: Session, model_digest: str, digest: str, size: int, inputs: list[dict[str, Any]]) -> None:
    """The model's sample inputs (one set per model: a new upload replaces it)."""
    from registry.models import ModelSample

    row = s.get(ModelSample, model_digest)
    if row is None:
        s.add(ModelSample(model_digest=model_digest, digest=digest, size=size, inputs=inputs))
    else:
        if row.digest != digest:  # the reference was these samples' outputs: new samples, a new one
            row.reference_digest = row.reference_size = row.reference_why = None
        row.digest, row.size, row.inputs = digest, size, inputs
    s.flush()


def wants_reference(s: Session, model_digest: str, sample_digest: str) -> bool:
    """Whether the accuracy check should keep the CPU reference outputs of these samples: they are
    still the model's and none is kept yet (one whose reason is recorded is tried again: the bound
    may have been raised)."""
    from registry.models import ModelSample

    row = s.get(ModelSample, model_digest)
    return row is not None and row.digest == sample_digest and row.reference_digest is None


def record_reference(s: Session, model_digest: str, sample_digest: str, digest: str | None, size: int | None,
                     why: str | None) -> bool:
    """Keep the reference blob (``digest``, ``size``) of the model's samples, or ``why`` none is
    kept. Guarded: only while ``sample_digest`` is still the model's samples (an upload meanwhile
    made the outputs someone else's). Whether it was recorded."""
    from sqlalchemy import update

    from registry.models import ModelSample

    done = s.execute(update(ModelSample).where(ModelSample.model_digest == model_digest,
                                               ModelSample.digest == sample_digest)
                     .values(reference_digest=digest, reference_size=size,
                             reference_why=None if digest else (why or "not kept")[:300])
                     .execution_options(synchronize_session=False))
    return bool(done.rowcount)  # type: ignore[attr-defined]
