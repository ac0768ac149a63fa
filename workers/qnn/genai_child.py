"""The child half of the genai checks (``workers.qnn.genai``): the only module besides
``workers.qnn.child`` and ``accuracy_child`` that imports onnxruntime, and the only one that
imports onnxruntime_genai.

    python -m workers.qnn.genai_child check REQUEST.json RESULT.json
    python -m workers.qnn.genai_child twin  REQUEST.json RESULT.json
    python -m workers.qnn.genai_child part_check REQUEST.json RESULT.json
    python -m workers.qnn.genai_child compile_part REQUEST.json RESULT.json

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
    those pairs). ``described``: {binary: its graphs}, binaries not laid out here, which the
    System API read when they were built (the same bytes): their graphs are taken as given.
    Any failure is ``GenaiFolderError`` naming the file."""
    from workers.qnn.sysapi import DescriptionError, describe_file

    folder = Path(req["folder"])
    described = {str(k): [str(g) for g in v] for k, v in (req.get("described") or {}).items()}
    config, stages = genai.inspect_folder(folder, elsewhere=described)
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
        if name in described:
            graphs = sorted(described[name])
        else:
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
             seconds: float | None = None, stop_file: Path | None = None) -> dict[str, Any]:
    """Greedy generation of ``tokens`` tokens from ``prompt`` through onnxruntime-genai (fewer
    where prompt and tokens would pass ``limit``, the KV-cache length): the prompt's ids, the
    tokens, each step's logits (the distribution the token was taken from), and the timings.
    ``minimum`` and ``seconds``: past ``minimum`` tokens, stop before a step that would take the
    generation (prefill included) past ``seconds`` (``stopped``: ``budget``), or once ``stop_file``
    exists (``stopped``: ``parts-done``: the parent's part checks finished, so a further token
    would cost wall time, not use a CPU that was free); else ``tokens``."""
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
        if minimum is not None and minimum <= len(out) < tokens:
            if seconds is not None and time.perf_counter() - t0 + (time.perf_counter() - step) > seconds:
                stopped = "budget"
                break
            if stop_file is not None and stop_file.exists():
                stopped = "parts-done"
                break
    decode = time.perf_counter() - t
    return {"prompt_ids": ids, "tokens": out, "logits": logits, "load_seconds": load, "prefill_seconds": prefill,
            "decode_seconds_per_token": decode / max(1, len(out)), "stopped": stopped}


def compare_runs(ref: dict[str, Any], twin: dict[str, Any], *, first: int = 0) -> dict[str, Any]:
    """Tokens matched (the common prefix: after a first difference the two runs see different
    text), where they first differ and by how much the reference preferred its token there (a
    near-tie flipped by the HTP's fp16 is a small gap; a broken graph a large one), the largest
    logit error over the steps both ran on the same text, and the logits PSNR of step ``first``
    (``first_step``: the first step the HTP computed; 1 when the prefill ran on the CPU EP)."""
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
                           "first_step": (compare(ref["logits"][first], twin["logits"][first])
                                          if len(a) > first and len(b) > first else None)}
    if matched < len(a) and matched < len(b):
        lg = ref["logits"][matched]
        out["mismatch_logit_gap"] = round(float(lg[a[matched]] - lg[b[matched]]), 6)
    return out


# ---- the twin's compiles -----------------------------------------------------------------------------

def twin_file(part: int, kind: str) -> str:
    """The fixed name of a part graph's twin context model (its binary: ``..._ctx_qnn.bin``)."""
    return f"part{part}_{kind}_ctx.onnx"


def _compile_parts(export: genai.GenaiExport, parts: list[genai.Part], out: Path,
                   provider_options: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """Each graph of ``parts`` compiled alone (no weight sharing: the simulator crashes on shared
    contexts), from the export's own folder (external data resolves beside the graph), to
    ``out/twin_file(...)``. Returns ({stage name: absolute path}, {role: compile seconds and
    placement}); ``ToolchainError`` when the EP compiled no node of a graph."""
    import onnxruntime as ort

    from workers.epcontext import read_epcontext
    from workers.qnn.child import _session_options

    files: dict[str, str] = {}
    graphs: dict[str, Any] = {}
    out.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    try:
        os.chdir(export.root)
        for p in parts:
            for st in (p.prefill, p.decode):
                _, so = _session_options(dict(provider_options))
                path = out / twin_file(p.index, st.kind)
                t = time.perf_counter()
                ort.ModelCompiler(so, st.graph.file, embed_compiled_data_into_model=False).compile_to_file(str(path))
                nodes, placement = read_epcontext(path)
                if not nodes:  # e.g. an SoC this SDK does not know: the "twin" would run on the CPU
                    raise ToolchainError(f"{st.graph.file}: the QNN EP compiled no node of it; no twin to run")
                graphs[st.role] = {"compile_seconds": round(time.perf_counter() - t, 3), **placement}
                files[st.name] = str(path.resolve())
    finally:
        os.chdir(here)
    return files, graphs


def compile_part(req: dict[str, Any]) -> dict[str, Any]:
    """One part's prefill and decode graph compiled without sharing into ``out_dir`` (a farm build
    can run each part's twin compile as its own job): ``{"files": {stage name: path},
    "graphs": {role: compile seconds, placement}, "compile_seconds"}``."""
    os.nice(int(req.get("nice", 10)))
    _pin(req.get("cpus"))
    export = genai.read_export(req["export"])
    index = int(req["part"])
    if not 0 <= index < len(export.parts):
        raise BadGenaiError(f"the export has {len(export.parts)} part(s), no part {index}")
    t = time.perf_counter()
    files, graphs = _compile_parts(export, [export.parts[index]], Path(req["out_dir"]),
                                   dict(req.get("provider_options") or {}))
    return {"part": index, "files": files, "graphs": graphs, "compile_seconds": round(time.perf_counter() - t, 3),
            **peaks()}


def peaks() -> dict[str, int]:
    """This process's peaks so far, in KiB: ``peak_rss_kib`` (VmHWM) and ``peak_vm_kib`` (VmPeak,
    the address space that RLIMIT_AS caps: the figure a twin child's cap is sized on,
    ``workers.qnn.genai.twin_cap_mb``); 0 where /proc can't tell."""
    out = {"peak_rss_kib": 0, "peak_vm_kib": 0}
    fields = {"VmHWM:": "peak_rss_kib", "VmPeak:": "peak_vm_kib"}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = fields.get(line.split(maxsplit=1)[0]) if line.strip() else None
                if key:
                    out[key] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _given_context(export: genai.GenaiExport, stage: genai.Stage, given: str, out: Path) -> dict[str, Any]:
    """A precompiled twin context placed in the twin folder under our fixed name: the context
    model copied (a few KiB) with its EPContext nodes pointing at fixed binary names, each binary
    a symbolic link to the one beside ``given`` (checked to stay in that folder: a binary's name
    is read from the file, never trusted). Returns its placement."""
    import onnx

    from farm.core.names import UnsafePathError, inside
    from workers.epcontext import read_epcontext

    src = Path(given)
    if not src.is_absolute() or not src.is_file():
        raise BadGenaiError(f"the compiled twin context of stage {stage.name!r} is not a file: {given}",
                            hint="compiled: {stage name: absolute path of an EPContext .onnx, its .bin beside it}")
    model = onnx.load(str(src), load_external_data=False)
    name = twin_file(stage.part or 0, stage.kind)
    renamed: dict[str, str] = {}
    for node in model.graph.node:
        for a in node.attribute:
            if node.op_type != "EPContext" or a.name != "ep_cache_context":
                continue
            if next((x.i for x in node.attribute if x.name == "embed_mode"), 1) != 0:
                continue
            old = a.s.decode("utf-8", "replace")
            if old not in renamed:
                try:
                    binary = inside(src.parent, old)
                except UnsafePathError as exc:
                    raise BadGenaiError(f"{src.name}: EPContext binary {exc}") from None
                new = f"{name[:-5]}_qnn.bin" if not renamed else f"{name[:-5]}_qnn_{len(renamed)}.bin"
                (out / new).unlink(missing_ok=True)
                os.symlink(binary, out / new)
                renamed[old] = new
            a.s = renamed[old].encode()
    onnx.save_model(model, str(out / name))
    nodes, placement = read_epcontext(out / name, model)
    if not nodes:
        raise ToolchainError(f"{given}: holds no EPContext node (stage {stage.name!r}); no twin to run")
    return {"compile_seconds": None, "given": True, **placement}


def _pin(cpus: Any) -> int:
    """This process (and the simulator threads it starts from here on) on ``cpus`` when given
    (those allowed here), else ``_simulator_cpus``'s choice. Returns how many CPUs it has."""
    allowed = os.sched_getaffinity(0)
    want = {int(c) for c in cpus if int(c) in allowed} if isinstance(cpus, list) else set()
    if want:
        os.sched_setaffinity(0, want)
        return len(want)
    return _simulator_cpus()


# ---- one part against the CPU EP ---------------------------------------------------------------------

# onnx element type -> numpy dtype name, for the inputs the check builds
_NP = {1: "float32", 10: "float16", 11: "float64", 7: "int64", 6: "int32", 9: "bool"}


def _np_dtype(elem: int, where: str) -> str:
    if elem not in _NP:
        raise BadGenaiError(f"{where}: element type {elem} is not one the twin's part check builds inputs of")
    return _NP[elem]


def part_feeds(export: genai.GenaiExport, part: genai.Part, kind: str, values: dict[str, Any], n: int,
               past: dict[str, Any] | None) -> dict[str, Any]:
    """The inputs of ``part``'s ``kind`` graph (``prefill`` or ``decode``): a hidden state or id
    input from ``values`` (what the stages before it computed on the CPU EP), the KV cache zeros
    for the prefill and ``past`` (the prefill's present outputs on the CPU EP) for the decode,
    ``past_seq_len`` / ``total_seq_len`` as genai gives them after ``n`` prompt tokens (the
    positions ``past_seq_len - S + 1 .. past_seq_len`` hold the chunk). A symbolic KV length is
    the cache length; any other symbolic dimension 1."""
    import numpy as np

    graph = part.prefill.graph if kind == "prefill" else part.decode.graph
    kv = export.kv
    pasts = {kv.past_key % layer for layer in part.layers} | {kv.past_value % layer for layer in part.layers}
    last = n - 1 if kind == "prefill" else n  # the position of the chunk's last token
    feeds: dict[str, Any] = {}
    for name, shape, elem in graph.inputs:
        dtype = _np_dtype(elem, f"{graph.file}: input {name!r}")
        dims = [d if isinstance(d, int) else (kv.length if name in pasts and i == 2 else 1)
                for i, d in enumerate(shape)]
        if name in values:
            feeds[name] = np.asarray(values[name]).astype(dtype, copy=False)
        elif name in pasts:
            feeds[name] = (np.zeros(dims, dtype) if past is None else
                           np.asarray(past[name]).astype(dtype, copy=False))
        elif name == "past_seq_len":
            feeds[name] = np.full(dims, last, dtype)
        elif name == "total_seq_len":
            feeds[name] = np.full(dims, last + 1, dtype)
        else:
            raise BadGenaiError(f"{graph.file}: input {name!r} is computed by no stage before part {part.index}",
                                hint="a part's inputs are the KV cache, past_seq_len/total_seq_len and outputs of "
                                     "the stages before it")
    return feeds


def _present_as_past(export: genai.GenaiExport, part: genai.Part, outputs: dict[str, Any]) -> dict[str, Any]:
    kv = export.kv
    out: dict[str, Any] = {}
    for layer in part.layers:
        out[kv.past_key % layer] = outputs[kv.present_key % layer]
        out[kv.past_value % layer] = outputs[kv.present_value % layer]
    return out


def _cpu_run(export: genai.GenaiExport, file: str, feeds: dict[str, Any]) -> dict[str, Any]:
    """One graph of the export on the CPU EP (loaded, run once, released: a part of a real model
    is GiBs, and the check holds one at a time)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(export.path(file)), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in want}), strict=True))


def part_inputs(export: genai.GenaiExport, index: int, ids: list[int], pad: int | None) -> tuple[Any, Any, int]:
    """(prefill values, decode values, n): what the stages before part ``index`` compute on the
    CPU EP for the prompt ``ids`` (its first window's tokens, left-padded with ``pad`` to the
    window, as genai's sliding window feeds a prompt shorter than it) and, for the decode, the
    prompt's first token again (a real token at position n). CPU stages run when every input
    they take is known (the embeddings first), the earlier parts in order."""
    import numpy as np

    w = export.kv.window
    ids = ids[:w]
    n = len(ids)
    fill = pad if isinstance(pad, int) and pad >= 0 else ids[0]
    sides: dict[str, dict[str, Any]] = {
        "prefill": {"input_ids": np.asarray([[fill] * (w - n) + ids], np.int64)},
        "decode": {"input_ids": np.asarray([[ids[0]]], np.int64)}}
    pasts: dict[str, Any] = {}
    for p in export.parts[:index]:
        for kind in ("prefill", "decode"):
            _cpu_stages(export, sides[kind])
            st = p.prefill if kind == "prefill" else p.decode
            out = _cpu_run(export, st.graph.file, part_feeds(export, p, kind, sides[kind], n,
                                                             pasts if kind == "decode" else None))
            if kind == "prefill":
                pasts = _present_as_past(export, p, out)
            sides[kind].update(out)
    for kind in ("prefill", "decode"):
        _cpu_stages(export, sides[kind])
    return sides["prefill"], sides["decode"], n


def _cpu_stages(export: genai.GenaiExport, values: dict[str, Any]) -> None:
    """Run each CPU stage (not the lm_head) whose inputs are all in ``values`` and whose outputs
    are not yet, in pipeline order (the embeddings on the ids)."""
    import numpy as np

    for st in export.cpu:
        if st.kind == "lm_head" or all(o in values for o in st.graph.output_names):
            continue
        if all(i in values for i in st.graph.input_names):
            feeds = {name: np.asarray(values[name]).astype(_np_dtype(elem, f"{st.graph.file}: input {name!r}"),
                                                          copy=False)
                     for name, _, elem in st.graph.inputs}
            values.update(_cpu_run(export, st.graph.file, feeds))


def _prompt_ids(export: genai.GenaiExport, folder: Path, prompt: str) -> list[int]:
    """``prompt`` as onnxruntime-genai's tokenizer encodes it (a folder of the config and the
    tokenizer files only: og.Config does not open the graphs)."""
    og = _register_qnn()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    _folder(export, folder, {s.name: s.graph.file for s in export.stages}, list(export.tokenizer), [])
    return [int(i) for i in og.Tokenizer(og.Config(str(folder))).encode(prompt)]


def part_check(req: dict[str, Any]) -> dict[str, Any]:
    """Part ``part`` of the export: its twin prefill graph and one decode step on the simulator
    (the context models at ``compiled[stage name]``) against the export's graphs on the CPU EP,
    with the same inputs (``part_inputs``; the decode takes the CPU prefill's KV cache), PSNR per
    output. ``cpus``: the CPUs this child and its simulator threads run on."""
    import onnxruntime as ort

    from workers.childproc import checkpoint
    from workers.qnn.accuracy import compare
    from workers.qnn.child import _session_options

    start = time.perf_counter()
    os.nice(int(req.get("nice", 10)))
    cpus = _pin(req.get("cpus"))
    export = genai.read_export(req["export"])
    index = int(req["part"])
    if not 0 <= index < len(export.parts):
        raise BadGenaiError(f"the export has {len(export.parts)} part(s), no part {index}")
    p = export.parts[index]
    compiled = dict(req.get("compiled") or {})
    for st in (p.prefill, p.decode):
        if not compiled.get(st.name):
            raise BadGenaiError(f"no compiled twin context for stage {st.name!r} (part {index})")
    timing: dict[str, float] = {}
    t = time.perf_counter()
    ids = _prompt_ids(export, Path(req["work"]) / "tokenizer", str(req.get("prompt") or genai.TWIN_PROMPT))
    if not ids:
        raise BadGenaiError("the twin's prompt encodes to no token", hint="give another prompt")
    pad = export.config.get("model", {}).get("pad_token_id")
    pre_in, dec_in, n = part_inputs(export, index, ids, pad if isinstance(pad, int) else None)
    pre_feeds = part_feeds(export, p, "prefill", pre_in, n, None)
    ref_pre = _cpu_run(export, p.prefill.graph.file, pre_feeds)
    dec_feeds = part_feeds(export, p, "decode", dec_in, n, _present_as_past(export, p, ref_pre))
    ref_dec = _cpu_run(export, p.decode.graph.file, dec_feeds)
    timing["reference"] = round(time.perf_counter() - t, 3)
    base: dict[str, Any] = {"part": index, "status": "runtime-crashed", "cpus": cpus, "prompt_tokens": n,
                            "detail": f"part {index}: the simulator crashed running its twin prefill graph"}
    checkpoint(base)
    out: dict[str, Any] = {"part": index, "cpus": cpus, "prompt_tokens": n}
    for kind, feeds, ref in (("prefill", pre_feeds, ref_pre), ("decode", dec_feeds, ref_dec)):
        st = p.prefill if kind == "prefill" else p.decode
        t = time.perf_counter()
        _, so = _session_options({})
        sess = ort.InferenceSession(compiled[st.name], so)
        timing[f"{kind}_load"] = round(time.perf_counter() - t, 3)
        names = [o.name for o in sess.get_outputs()]
        t = time.perf_counter()
        got = dict(zip(names, sess.run(names, feeds), strict=True))
        timing[kind] = round(time.perf_counter() - t, 3)
        del sess
        out[kind] = {name: compare(ref[name], got[name])["psnr_db"] for name in st.graph.output_names}
        if kind == "prefill":
            checkpoint({**base, **out, "detail": f"part {index}: the simulator crashed running its twin decode graph"})
    worst = min(((v, kind, name) for kind in ("prefill", "decode") for name, v in out[kind].items()),
                default=None)
    return {**out, "status": "ok", "detail": None,
            "worst": {"phase": worst[1], "output": worst[2], "psnr_db": worst[0]} if worst else None,
            "timing": timing, "seconds": round(time.perf_counter() - start, 3), **peaks()}


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
    """The twin's end-to-end generation: the twin folder (each part's prefill and decode graph
    compiled on their own: no weight sharing, the simulator crashes on shared contexts) run
    through onnxruntime-genai on the HTP backend and the source pipeline on the CPU EP, ``tokens``
    greedy tokens from ``prompt`` each. ``compiled`` ({stage name: absolute path of a context
    model, its binary beside it}) for every part stage: nothing is compiled here (``compiled``:
    ``given``); else the parts are compiled first (``here``). ``cpus``: the CPUs the simulator
    threads run on. Steps finished before a crash are checkpointed."""
    from workers.childproc import checkpoint

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

    # The twin: the given context models, or each part graph compiled alone, to fixed names of ours.
    given = dict(req.get("compiled") or {})
    stages = [st for p in export.parts for st in (p.prefill, p.decode)]
    compiled: dict[str, str] = {s.name: s.graph.file for s in export.cpu}
    t0 = time.perf_counter()
    if all(given.get(st.name) for st in stages):
        graphs = {st.role: _given_context(export, st, str(given[st.name]), twin_dir) for st in stages}
        compiled.update({st.name: twin_file(st.part or 0, st.kind) for st in stages})
        how = "given"
    else:
        files, graphs = _compile_parts(export, list(export.parts), twin_dir, dict(req.get("provider_options") or {}))
        compiled.update({name: Path(f).name for name, f in files.items()})
        how = "here"
    compile_seconds = time.perf_counter() - t0 if how == "here" else 0.0
    prefill_on = str(req.get("prefill_on") or "qnn")
    carried = export.carried_files()
    if prefill_on == "cpu":  # the prefill graphs as exported (their figures are the part checks')
        for p in export.parts:
            compiled[p.prefill.name] = p.prefill.graph.file
            carried += [f for f in (p.prefill.graph.file, *p.prefill.graph.data) if f not in carried]
        minimum += 1  # the first token comes from the prefill: ``minimum`` tokens from the HTP's decode steps
        tokens = max(tokens, minimum)
    for f in carried:
        if not (twin_dir / f).exists():
            _place(export.path(f), twin_dir / f)
    cfg = genai.genai_config(export, compiled)  # QNN stages as the device runs them
    if prefill_on == "cpu":
        for p in export.parts:
            cfg["model"]["decoder"]["pipeline"][0][p.prefill.name]["session_options"] = {"provider_options": []}
    (twin_dir / genai.CONFIG_FILE).write_bytes(genai.config_bytes(cfg))
    base: dict[str, Any] = {"status": "runtime-crashed", "graphs": graphs, "compile_seconds": round(compile_seconds, 3),
                            "compiled": how, "prefill_on": prefill_on,
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
    base["simulator_cpus"] = _pin(req.get("cpus"))
    try:
        got = generate(twin_dir, prompt, len(ref["tokens"]), export.kv.length, minimum=minimum,
                       seconds=float(seconds) if seconds is not None else None,
                       stop_file=Path(req["stop_file"]) if req.get("stop_file") else None)
    except Exception as exc:  # the runtime refused the twin: nothing to compare, say why
        return {**base, "status": "unverified", "reference_tokens": ref["tokens"], "timing": timing,
                "detail": f"onnxruntime-genai could not run the twin on QNN: {str(exc).strip()[:1500]}", **peaks()}
    timing["twin"] = {k: round(v, 4) for k, v in got.items() if k.endswith("seconds") or k.endswith("token")}
    if got["stopped"] != "tokens":  # compared on the tokens the simulator had time for
        n = len(got["tokens"])
        ref = {**ref, "tokens": ref["tokens"][:n], "logits": ref["logits"][:n]}
    return {**base, "status": "ok", "detail": None, "prompt_tokens": len(ref["prompt_ids"]),
            **compare_runs(ref, got, first=1 if prefill_on == "cpu" else 0), "tokens_stopped": got["stopped"],
            "timing": timing, **peaks()}


def _preload_check() -> None:
    """A warm check host's start (``genai_child host``, ``workers.qnn.genai.check_folder``):
    onnxruntime-genai imported with the QNN EP registered, onnx and the System API reader
    imported, once; each folder check is a job forked from it (``workers.host``), so a package's
    check, and each further target's, starts without an interpreter and those imports."""
    import onnx  # noqa: F401 - farm.core.genai.inspect_folder reads the stages with it

    import workers.qnn.sysapi  # noqa: F401

    _register_qnn()


def main(argv: list[str]) -> int:
    from workers.childproc import Commands, run_commands

    commands: Commands = {"check": check, "twin": twin, "part_check": part_check, "compile_part": compile_part}
    if len(argv) == 2 and argv[1] == "host":  # the folder check only: the twin runs in a child of its own
        return run_commands(argv, {"check": check}, preload=_preload_check)
    if not (len(argv) == 4 and argv[1] in commands):
        print(f"usage: python -m workers.qnn.genai_child {'|'.join(commands)} REQUEST.json RESULT.json",
              file=sys.stderr)
        return 2
    return run_commands(argv, commands)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
