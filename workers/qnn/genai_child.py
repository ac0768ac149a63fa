"""The child half of the genai checks (``workers.qnn.genai``): the only module besides
``workers.qnn.child`` and ``accuracy_child`` that imports onnxruntime, and the only one that
imports onnxruntime_genai.

    python -m workers.qnn.genai_child check REQUEST.json RESULT.json
    python -m workers.qnn.genai_child twin  REQUEST.json RESULT.json

Run only as a child process (``workers.runner.run_child``): a simulator that crashes or hangs
costs one record, never the worker.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from farm.core import genai
from farm.core.errors import BadGenaiError, GenaiFolderError, ToolchainError

_REGISTERED: list[bool] = []


def _register_qnn() -> Any:
    """onnxruntime-genai with the QNN plugin EP registered (once per process): without it a
    ``qnn`` provider in a config fails with "QNN execution provider is not supported"."""
    import onnxruntime_genai as og
    import onnxruntime_qnn as oq

    if not _REGISTERED:
        og.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
        _REGISTERED.append(True)
    return og


def _system_library() -> str:
    import onnxruntime_qnn as oq

    return os.path.join(os.path.dirname(oq.get_library_path()), "libQnnSystem.so")


# ---- the folder check ----------------------------------------------------------------------------

def check(req: dict[str, Any]) -> dict[str, Any]:
    """A built folder: what ``farm.core.genai.inspect_folder`` checks (config shape, every file
    it names, external data and EPContext paths inside the folder), then ``og.Config(dir)``
    (onnxruntime-genai's own schema check), then each context binary as the QNN System API reads
    it: it holds exactly the graphs its EPContext nodes name, and those are one prefill and one
    decode stage (``parts``, when given as [[prefill file, decode file], ...], must be exactly
    those pairs). Any failure is ``GenaiFolderError`` naming the file."""
    from workers.qnn.sysapi import DescriptionError, describe_file

    folder = Path(req["folder"])
    config, stages = genai.inspect_folder(folder)
    og = _register_qnn()
    try:
        og.Config(str(folder))
    except Exception as exc:  # genai raises RuntimeError / OSError with its parser's words
        raise GenaiFolderError(f"{genai.CONFIG_FILE}: onnxruntime-genai refuses it: {str(exc).strip()[:500]}") from None
    by_file = {s.file: s for s in stages}
    binaries: dict[str, Any] = {}
    library = _system_library()
    for name, users in genai.shared_binaries(stages).items():
        files = [s.file for s in users]
        nodes = sorted(n for s in users for n in s.contexts)
        prefill = [s for s in users if s.run_on_prompt and not s.run_on_token_gen]
        decode = [s for s in users if s.run_on_token_gen and not s.run_on_prompt]
        if len(users) != 2 or len(prefill) != 1 or len(decode) != 1:
            raise GenaiFolderError(f"{name}: used by {files}, not by one part's prefill and decode stage")
        try:
            desc = describe_file(library, str(folder.resolve() / name))
        except (DescriptionError, OSError, ValueError) as exc:
            raise GenaiFolderError(f"{name}: not a context binary this QNN SDK reads ({str(exc)[:300]})") from None
        graphs = sorted(str(g.get("name")) for g in desc.get("graphs", []))
        if graphs != nodes:
            raise GenaiFolderError(f"{name}: holds the graphs {graphs[:8]}, but the EPContext nodes of {files} "
                                   f"name {nodes[:8]}", hint="a part's binary holds exactly its prefill and decode graph")
        binaries[name] = {"graphs": graphs, "stages": files, "prefill": prefill[0].file, "decode": decode[0].file}
    for i, pair in enumerate(req.get("parts") or []):
        if not isinstance(pair, list) or len(pair) != 2 or any(f not in by_file for f in pair):
            raise GenaiFolderError(f"part {i}: {str(pair)[:200]} are not two stages of {genai.CONFIG_FILE}")
        bins = {b for f in pair for b in by_file[f].binaries}
        if len(bins) != 1 or set(by_file[pair[0]].binaries) != set(by_file[pair[1]].binaries):
            raise GenaiFolderError(f"part {i}: {pair[0]} and {pair[1]} do not share one context binary "
                                   f"({sorted(bins)[:4]})")
    return {"stages": [{"name": s.name, "file": s.file, "binaries": list(s.binaries), "contexts": list(s.contexts)}
                       for s in stages],
            "binaries": binaries, "genai_version": og.__version__}


# ---- the twin --------------------------------------------------------------------------------------

def _place(src: Path, dst: Path) -> None:
    """A file of the source export in a run folder: a symbolic link (no copy of GiBs of
    weights). Never a hard link: onnx's checker refuses external data with several links (a
    "hardlink attack"), so a hard link would make the export itself unbuildable while it lives."""
    os.symlink(src.resolve(), dst)


def _folder(export: genai.GenaiExport, out: Path, files: dict[str, str], carried: list[str],
            provider_options: list[dict[str, Any]] | None) -> None:
    for f in carried:
        if not (out / f).exists():
            _place(export.path(f), out / f)
    cfg = genai.genai_config(export, files, provider_options=provider_options)
    (out / genai.CONFIG_FILE).write_bytes(genai.config_bytes(cfg))


def generate(folder: Path, prompt: str, tokens: int, limit: int | None = None, *, minimum: int | None = None,
             seconds: float | None = None) -> dict[str, Any]:
    """Greedy generation of ``tokens`` tokens from ``prompt`` through onnxruntime-genai (fewer
    where prompt and tokens would pass ``limit``, the KV-cache length): the prompt's ids, the
    tokens, each step's logits (the distribution the token was taken from), and the timings.
    ``minimum`` and ``seconds``: past ``minimum`` tokens, stop before a step that would take the
    generation (prefill included) past ``seconds`` (``stopped``: ``budget``; else ``tokens``)."""
    import numpy as np
    import onnxruntime_genai as og

    t = time.perf_counter()
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    load = time.perf_counter() - t
    ids = [int(i) for i in tokenizer.encode(prompt)]
    if limit is not None:
        tokens = min(tokens, limit - len(ids))
        if tokens < 1:
            raise BadGenaiError(f"the twin's prompt is {len(ids)} tokens, the KV cache holds {limit}",
                                hint="give a shorter prompt")
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False)
    gen = og.Generator(model, params)
    t0 = t = time.perf_counter()
    gen.append_tokens(np.asarray(ids, dtype=np.int32))
    prefill = time.perf_counter() - t
    out: list[int] = []
    logits: list[Any] = []
    stopped = "tokens"
    t = time.perf_counter()
    for _ in range(tokens):
        # genai runs a step lazily: the logits of the token chosen last (the prompt's, first).
        step = time.perf_counter()
        logits.append(np.asarray(gen.get_logits(), dtype=np.float32).reshape(-1))
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
        if (minimum is not None and seconds is not None and minimum <= len(out) < tokens
                and time.perf_counter() - t0 + (time.perf_counter() - step) > seconds):
            stopped = "budget"
            break
    decode = time.perf_counter() - t
    return {"prompt_ids": ids, "tokens": out, "logits": logits, "load_seconds": load, "prefill_seconds": prefill,
            "decode_seconds_per_token": decode / max(1, len(out)), "stopped": stopped}


def compare_runs(ref: dict[str, Any], twin: dict[str, Any]) -> dict[str, Any]:
    """Tokens matched (the common prefix: after a first difference the two runs see different
    text), where they first differ and by how much the reference preferred its token there (a
    near-tie flipped by the HTP's fp16 is a small gap; a broken graph a large one), the largest
    logit error over the steps both ran on the same text, and the first step's logits PSNR."""
    import numpy as np

    from workers.qnn.accuracy import compare

    a, b = ref["tokens"], twin["tokens"]
    matched = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    same_text = min(matched + 1, len(a), len(b))
    errors = [float(np.max(np.abs(ref["logits"][i] - twin["logits"][i]))) for i in range(same_text)
              if ref["logits"][i].shape == twin["logits"][i].shape]
    out: dict[str, Any] = {"tokens_compared": len(a), "tokens_matched": matched,
                           "reference_tokens": a, "twin_tokens": b,
                           "first_mismatch": None if matched == len(a) else matched,
                           "mismatch_logit_gap": None,
                           "max_logit_error": round(max(errors), 6) if errors else None,
                           "first_step": compare(ref["logits"][0], twin["logits"][0]) if a and b else None}
    if matched < len(a) and matched < len(b):
        lg = ref["logits"][matched]
        out["mismatch_logit_gap"] = round(float(lg[a[matched]] - lg[b[matched]]), 6)
    return out


# The HTP simulator runs a graph on 4 busy HVX threads (thr_hvx_0..3, measured, QNN 2.51.0).
HVX_THREADS = 4


def _simulator_cpus() -> int:
    """With fewer CPUs than the simulator's HVX threads, the threads that the QNN sessions
    create from here on run on one CPU: on 2 shared cores that cost 0.95 s of CPU per decode
    graph run against 1.27 s spread over both, 3.15 s against 4.0 s per prefill run (hidden
    1024, 4 layers a part; measured, QNN 2.51.0), and less wall time too; compiles are not
    affected (single-threaded: 7.9 s of CPU for four, either way). Returns the CPUs they get."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) >= HVX_THREADS:
        return len(allowed)
    os.sched_setaffinity(0, {min(allowed)})  # this thread: the simulator's threads inherit it
    return 1


def twin(req: dict[str, Any]) -> dict[str, Any]:
    """The twin check of an export: each part's prefill and decode graph compiled on their own
    (no weight sharing: the simulator crashes on shared contexts), the twin folder run through
    onnxruntime-genai on the HTP backend and the source pipeline on the CPU EP, ``tokens``
    greedy tokens from ``prompt`` each. Steps finished before a crash are checkpointed."""
    import onnxruntime as ort

    from workers.childproc import checkpoint
    from workers.epcontext import read_epcontext
    from workers.qnn.child import _session_options

    # A worker's twin yields the CPU to its compiles; the embedded command's twin is what it waits on.
    os.nice(int(req.get("nice", 10)))
    export = genai.read_export(req["export"])
    work = Path(req["work"])
    tokens = int(req.get("tokens", 16))
    minimum = min(tokens, int(req.get("min_tokens", tokens)))
    seconds = req.get("generate_seconds")
    prompt = str(req.get("prompt") or genai.TWIN_PROMPT)
    src_dir, twin_dir = work / "source", work / "twin"
    for d in (src_dir, twin_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)

    # The source pipeline, every stage on the CPU EP.
    names = {s.name: s.graph.file for s in export.stages}
    src_files = list(dict.fromkeys(f for s in export.stages for f in (s.graph.file, *s.graph.data)))
    _folder(export, src_dir, names, src_files + list(export.tokenizer), [])

    # The twin: each part graph compiled alone, from the export's own folder (external data
    # resolves beside the graph), to a fixed name of ours.
    compiled: dict[str, str] = {s.name: s.graph.file for s in export.cpu}
    graphs: dict[str, Any] = {}
    t0 = time.perf_counter()
    here = os.getcwd()
    try:
        os.chdir(export.root)
        for p in export.parts:
            for st in (p.prefill, p.decode):
                _, so = _session_options(dict(req.get("provider_options") or {}))
                name = f"part{p.index}_{st.kind}_ctx.onnx"
                t = time.perf_counter()
                ort.ModelCompiler(so, st.graph.file, embed_compiled_data_into_model=False).compile_to_file(
                    str(twin_dir / name))
                nodes, placement = read_epcontext(twin_dir / name)
                if not nodes:  # e.g. an SoC this SDK does not know: the "twin" would run on the CPU
                    raise ToolchainError(f"{st.graph.file}: the QNN EP compiled no node of it; no twin to run")
                graphs[st.role] = {"compile_seconds": round(time.perf_counter() - t, 3), **placement}
                compiled[st.name] = name
    finally:
        os.chdir(here)
    compile_seconds = time.perf_counter() - t0
    _folder(export, twin_dir, compiled, export.carried_files(), None)  # QNN stages as the device runs them
    base: dict[str, Any] = {"status": "runtime-crashed", "graphs": graphs, "compile_seconds": round(compile_seconds, 3),
                            "compile_options": dict(req.get("provider_options") or {}),
                            "tokens_compared": tokens, "tokens_matched": 0, "prompt": prompt}
    checkpoint({**base, "detail": "the source pipeline crashed onnxruntime-genai on the CPU EP"})

    ref = generate(src_dir, prompt, tokens, export.kv.length)
    pad = export.config.get("model", {}).get("pad_token_id")
    if isinstance(pad, int) and pad in ref["prompt_ids"]:
        raise BadGenaiError(f"the twin's prompt encodes to the pad token {pad}: genai pads prompt windows with "
                            "it, so the prompt must not contain it", hint="give another prompt")
    timing = {"reference": {k: round(v, 4) for k, v in ref.items() if k.endswith("seconds") or k.endswith("token")}}
    checkpoint({**base, "reference_tokens": ref["tokens"], "timing": timing,
                "detail": "loading or running the twin crashed onnxruntime-genai on the QNN HTP backend"})
    _register_qnn()
    base["simulator_cpus"] = _simulator_cpus()
    try:
        got = generate(twin_dir, prompt, len(ref["tokens"]), export.kv.length, minimum=minimum,
                       seconds=float(seconds) if seconds is not None else None)
    except Exception as exc:  # the runtime refused the twin: nothing to compare, say why
        return {**base, "status": "unverified", "reference_tokens": ref["tokens"], "timing": timing,
                "detail": f"onnxruntime-genai could not run the twin on QNN: {str(exc).strip()[:1500]}"}
    timing["twin"] = {k: round(v, 4) for k, v in got.items() if k.endswith("seconds") or k.endswith("token")}
    if got["stopped"] == "budget":  # compared on the tokens the simulator had time for
        n = len(got["tokens"])
        ref = {**ref, "tokens": ref["tokens"][:n], "logits": ref["logits"][:n]}
    return {**base, "status": "ok", "detail": None, "prompt_tokens": len(ref["prompt_ids"]),
            **compare_runs(ref, got), "tokens_stopped": got["stopped"], "timing": timing}


def _preload_check() -> None:
    """A warm check host's start (``genai_child host``, ``workers.qnn.genai.check_folder``):
    onnxruntime-genai imported with the QNN EP registered, onnx and the System API reader
    imported, once; each folder check is a job forked from it (``workers.host``), so a package's
    check, and each further target's, starts without an interpreter and those imports."""
    import onnx  # noqa: F401 - farm.core.genai.inspect_folder reads the stages with it

    import workers.qnn.sysapi  # noqa: F401

    _register_qnn()


def main(argv: list[str]) -> int:
    from workers.childproc import run_commands

    if len(argv) == 2 and argv[1] == "host":  # the folder check only: the twin runs in a child of its own
        return run_commands(argv, {"check": check}, preload=_preload_check)
    if not (len(argv) == 4 and argv[1] in ("check", "twin")):
        print("usage: python -m workers.qnn.genai_child check|twin REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    return run_commands(argv, {"check": check, "twin": twin})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
