"""The twin of a published genai package: the same parts compiled without sharing (each part's
twin build, ``farm.pipeline.genai.twin_builds``) and generated from on the simulator against the
CPU EP (``workers.backends.genai_twin`` on those contexts), budgeted like the accuracy check. It is
evidence that follows publication: ``pending`` on the artifact until it is recorded, never a
verdict on the build; ``--require-twin`` gates the command's answer on it."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError
from farm.core.genai import TWIN_MIN_PSNR
from farm.core.settings import Settings
from farm.pipeline.genai.bundle import PackageReport
from farm.pipeline.genai.twin_builds import collect_compiled, package_twins, settle_twins, twin_figures, twin_ids
from farm.pipeline.genai.twin_record import (
    _description,
    raised_twin,
    record_twin,
    twin_status,
    twin_to_run,
)
from farm.pipeline.submission import BuildOutcome, Progress

log = logging.getLogger("ctxfarm.genai")


def _then_twin(settings: Settings, reg: Any, result: PackageReport, planned: Sequence[tuple[Any, Any, int]],
               export_dir: Path, *, twin: bool, require: bool, progress: Progress,
               published: Callable[[PackageReport], None] | None,
               twins: Mapping[int, tuple[list[Any], list[Future[Any]]]] | None = None) -> PackageReport:
    """After publication (every outcome final): say so, hand the answer to ``published``, then
    run each published package's twin that is missing or pending, record it, and gate the
    answer on it with ``require``. ``twins``: per target (its index in ``planned``), its parts'
    twin builds (specs) and the pool's jobs that run them: the check waits for them and runs on their
    contexts. The command waits on this check, so it runs at nice 0."""
    for (t, _, _), o in zip(planned, result.package.outcomes, strict=True):
        if o.state != "failed" and o.artifact:
            progress("published", t.ref, {"artifact": o.artifact, "at": datetime.now(UTC).isoformat(timespec="seconds"),
                                          "twin": twin_status(_description(reg, o.artifact))})
    if published is not None:
        published(result)
    for k, ((t, spec, _), o) in enumerate(zip(planned, result.package.outcomes, strict=True)):
        if not (twin and o.state != "failed" and o.artifact):
            continue
        desc = _description(reg, o.artifact)
        if twin_status(desc) is None or twin_to_run(desc):
            progress("checking", t.ref, {"what": "twin"})
            ids: list[int] | None = None
            if twins is not None and k in twins:
                specs, jobs = twins[k]
                # Each job records its end on its twin build's row; one that raised (a bug) is
                # what the twin records, never a pending twin with the cause lost.
                raised = next((e for e in (j.exception() for j in jobs) if e is not None), None)
                if raised is not None:
                    if not isinstance(raised, Exception):
                        raise raised  # Ctrl-C, SIGTERM: the twin stays pending
                    tw = raised_twin("a twin build", raised)
                    record_twin(reg, o.artifact, tw)
                    progress("twin", t.ref, {"artifact": o.artifact, **tw})
                    continue
                ids = twin_ids(reg, specs)
            tw = verify_twin(settings, reg, o.artifact, spec, export_dir, nice=0, twins=ids)
            progress("twin", t.ref, {"artifact": o.artifact, **tw})
    result.package.outcomes = [_with_twin(reg, o, require) for o in result.package.outcomes]
    return result


def _with_twin(reg: Any, o: BuildOutcome, require: bool) -> BuildOutcome:
    """The twin's figures on the outcome (``o.accuracy`` carries them as ``{"twin": ...}``) and,
    with ``require``, the gate: every compared token matched, else ``twin-mismatch``."""
    if o.state == "failed" or not o.artifact:
        return o
    from registry.index import find_artifact

    with reg.db.session() as s:
        desc = find_artifact(s, o.artifact).description or {}
    tw = desc.get("twin")
    o.accuracy = {"twin": tw} if tw is not None else None
    if require:
        refusal = twin_refusal(tw, o.artifact)
        if refusal is not None:
            o.state, o.error_code, o.error_message = "failed", refusal.code, refusal.message
    return o


def verify_twin(settings: Settings, reg: Any, artifact: str, spec: Any, export_dir: Path, *,
                nice: int = 10, twins: Sequence[int] | None = None) -> dict[str, Any]:
    """The twin of a published package, run and recorded on its artifact (never a verdict on
    the build: a twin that fails or mismatches is recorded evidence). ``twins``: its parts' twin
    builds, final (their contexts are checked, nothing compiled here). A twin that raises (a bug)
    is recorded ``unverified`` with what it raised: never left ``pending`` with the cause lost."""
    try:
        tw = run_twin(settings, spec, export_dir, nice=nice, twins=twins, reg=reg)
    except Exception as exc:  # noqa: BLE001 - recorded on the artifact and logged, never lost
        import logging

        logging.getLogger("ctxfarm.genai").error("the twin of %s raised", artifact[7:19], exc_info=True)
        tw = raised_twin("", exc)
    record_twin(reg, artifact, tw)
    return tw


def twin_refusal(tw: dict[str, Any] | None, artifact: str, *, min_psnr: float = TWIN_MIN_PSNR) -> FarmError | None:
    """The --require-twin gate: None when every compared token matched and every output of every
    part's check (``parts``: prefill and one decode step on the simulator against the CPU EP) is
    at or above ``min_psnr`` dB; the refusal names the part and the output (checked first: it
    says where a mismatch of the tokens comes from). A twin recorded
    before the part checks existed (no ``parts``) is gated on its tokens."""
    from farm.core.errors import TwinMismatchError

    if not tw or tw.get("status") != "ok":
        why = (tw or {}).get("detail") or "no twin check ran"
        return TwinMismatchError(f"artifact {artifact[7:19]}: no twin figures to gate on ({why})")
    for part in tw.get("parts") or []:
        index = part.get("part") if isinstance(part, dict) else None
        if not isinstance(part, dict) or part.get("status") != "ok":
            why = (part.get("detail") if isinstance(part, dict) else None) or "no figures"
            return TwinMismatchError(f"artifact {artifact[7:19]}: the twin's check of part {index} did not run "
                                     f"({str(why)[:300]})")
        for phase in ("prefill", "decode"):
            for output, psnr in (part.get(phase) or {}).items():
                if not isinstance(psnr, int | float) or psnr < min_psnr:
                    return TwinMismatchError(
                        f"artifact {artifact[7:19]}: part {index}'s {phase} graph on the simulator: output {output!r} "
                        f"at {psnr} dB PSNR against the CPU EP, below {min_psnr:g} dB",
                        hint="the package is built and published; the HTP runs float graphs in fp16: check that "
                             "part for values beyond fp16's range (65,504); drop --require-twin to accept it")
    if not tw.get("tokens_compared") or tw.get("tokens_matched") != tw.get("tokens_compared"):
        return TwinMismatchError(f"artifact {artifact[7:19]}: the twin matched {tw.get('tokens_matched')} of "
                                 f"{tw.get('tokens_compared')} greedy tokens against the CPU EP")
    return None


def run_twin(settings: Settings, spec: Any, export_dir: Path, *, nice: int = 10, twins: Sequence[int] | None = None,
             reg: Any = None) -> dict[str, Any]:
    """The twin (``workers.backends.genai_twin``) under the accuracy budget
    (``FARM_ACCURACY_BUDGET``); a twin that can't run is recorded as ``unverified`` with the
    reason, never a failed package: the twin is evidence, not the artifact. ``twins`` (with
    ``reg``): the parts' twin builds, whose contexts it runs (one that failed: ``unverified``
    with its code and message); without them it compiles the parts itself."""
    from farm.core.catalog import load_catalog
    from workers.backends import genai_twin

    target = load_catalog().get(spec.target, backend=spec.backend)
    start = time.perf_counter()
    built: dict[str, Any] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-genai-twin-") as work:
            compiled = None
            if twins is not None and reg is not None:
                from farm.core.genai import read_export

                built = twin_figures(reg, twins)
                compiled, why = collect_compiled(reg, twins, read_export(export_dir), Path(work) / "compiled")
                if compiled is None:
                    raise TwinBuildFailed(why)
                if built.get("target"):  # their arch's reference SoC: the record says what they were compiled for
                    target = load_catalog().get(built["target"], backend=spec.backend)
            result = genai_twin(export_dir, target, spec.options, Path(work) / "check",
                                timeout=settings.accuracy_budget, memory_mb=settings.compile_memory_mb, nice=nice,
                                compiled=compiled)
    except TwinBuildFailed as exc:
        result = {"status": "unverified", "detail": str(exc)}
        if twins is not None and _cancelled(reg, twins):
            result["cancelled"] = True  # its release was cancelled: the next submission runs it
    except FarmError as exc:
        result = {"status": "unverified", "detail": f"{exc.code}: {exc.message[:1000]}"}
    result = dict(result)
    if built is not None:
        result["twin_builds"] = built
    result.setdefault("wall_seconds", round(time.perf_counter() - start, 3))
    return result


def _cancelled(reg: Any, twin_ids: Sequence[int]) -> bool:
    """Whether a twin build of these was cancelled (``farm cancel`` of its package's release)."""
    from farm.pipeline import states
    from registry.models import TwinBuild

    with reg.db.session() as s:
        return any(states.get_build(s, i, TwinBuild).error_code == "cancelled" for i in twin_ids)


class TwinBuildFailed(Exception):
    """A part's twin build did not succeed: the twin is ``unverified`` with why."""


def twin_after(executor: Any, build_id: int, queue: str | None, spec: Any, export_root: Path, artifact: str) -> None:
    """The twin of a published package on a worker: its parts' twin builds final (sent when the
    package was submitted, so other workers may have compiled them already; any still queued,
    or whose holder died, is run here; one another worker holds is waited for), all within the
    accuracy budget, then the check on their contexts, recorded on the artifact. Whatever befalls
    it is no verdict on the build: a twin build that failed is ``unverified`` with its reason; a
    worker killed here leaves ``pending``, and the next submission of the package runs it."""
    reg, settings = executor.registry, executor.settings
    try:
        try:
            with reg.db.session() as s:
                twins = package_twins(s, build_id, queue)
            settle_twins(executor, twins or [], deadline=time.monotonic() + settings.accuracy_budget)
        except Exception as exc:  # a bug: recorded on the artifact, never left pending with the cause lost
            log.error("the twin builds of build %s raised", build_id, exc_info=True)
            record_twin(reg, artifact, raised_twin("the twin builds", exc))
            return
        verify_twin(settings, reg, artifact, spec, export_root, twins=twins)
    except Exception:  # noqa: BLE001 - logged; the published build's result stands
        log.warning("the twin of build %s was not recorded", build_id, exc_info=True)
