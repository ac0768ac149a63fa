"""onnxruntime-genai packages: an exported static LLM pipeline, read into a description the farm
passes along, and the ``genai_config.json`` of the folder it ships.

The one module that knows this artifact's shape (STYLE habit 16; ``farm.core.groups`` is the
example). An exporter leaves a folder: CPU stages (``embeddings``, ``lm_head``, others), per part
a prefill graph (fixed length W, the sliding window) and a decode graph (length 1) sharing one
external-data file, tokenizer files and the exporter's ``genai_config.json`` (model type
``decoder-pipeline``). Two layouts are recognised, from the graph file names and the config:

- ``olive``: Olive's QNN recipe (StaticLLM + SplitModel): ``embeddings.onnx``,
  ``context_<i>.onnx`` / ``iterator_<i>.onnx`` (``context.onnx`` / ``iterator.onnx`` for one
  part, i from 0), ``lm_head.onnx``; each part's pair shares one data file (Olive 0.13 writes
  ``context_<i>.onnx.data``; tests/data/genai/olive-qwen2-tiny is its output). Its KV length may
  be symbolic (genai sizes the cache from ``context_length``).
- ``aihub``: Qualcomm AI Hub's naming: ``prompt_ar<W>_cl<C>_<i>_of_<N>.onnx`` and
  ``token_ar1_cl<C>_<i>_of_<N>.onnx`` (i from 1), plus its CPU stages.

``read_export(dir)`` returns a ``GenaiExport`` or raises ``BadGenaiError`` (``bad-genai``)
naming the offending file. Reads are bounded (the config at ``MAX_CONFIG_BYTES``, a graph at
``MAX_GRAPH_BYTES``, the listing at ``MAX_ENTRIES``); a file name is used only after it matched
``FILE_NAME_RE`` and resolved inside the folder (``farm.core.names.inside``): nothing in a path
comes from a name the folder chose without that check.

``genai_config(export, files, provider_options=...)`` writes the config of a folder whose stages
are at ``files[stage name]``: ``package_layout(export)`` (the compiled ``context_0_ctx.onnx``...
for the parts, the CPU stages as they are; a part's binary ``part_binary``); ``roles(export)``
names each stage's role for the manifest. ``inspect_folder(dir)`` reads a built folder back
without a runtime (``genai-folder-invalid`` naming the file); ``workers.qnn.genai`` adds what
needs one (og.Config, each binary's graphs) and the twin.

Uses ``onnx`` only, never onnxruntime (the worker side is ``workers/qnn/genai*.py``).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core import genai_schema, jsonspec
from farm.core.errors import BadGenaiError
from farm.core.names import UnsafePathError, UnusablePathError, canonical_relative, input_file, input_folder, inside

CONFIG_FILE = "genai_config.json"
MAX_CONFIG_BYTES = 1 << 20          # a real genai_config.json is a few KiB
MAX_GRAPH_BYTES = 2 * 1024 ** 3     # protobuf's own limit: weights beyond it are external data
MAX_TOKENIZER_BYTES = 128 << 20     # the largest tokenizer.json we know (Gemma's) is ~33 MiB
MAX_ENTRIES = 4096                  # files in an export folder
MAX_PARTS = 64
MAX_STAGES = genai_schema.MAX_STAGES
MAX_CONTEXT = genai_schema.MAX_CONTEXT  # tokens in a KV cache
MAX_HEADS = 1024
MAX_HEAD_SIZE = 4096
# Names an export folder may use for the files the package carries: plain file names, no
# directory, no leading dot. Everything else in the folder is ignored, never opened.
FILE_NAME_RE = genai_schema.FILE_NAME_RE
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                   "generation_config.json")
LAYOUTS = ("olive", "aihub")
STAGE_NAME_RE = genai_schema.STAGE_NAME_RE
OLIVE_RE = re.compile(r"(context|iterator)(?:_(\d{1,3}))?\.onnx")
AIHUB_RE = re.compile(r"(prompt|token)_ar(\d{1,5})_cl(\d{1,6})_(\d{1,3})_of_(\d{1,3})\.onnx")
# KV-cache naming conventions, as (past key, past value, present key, present value) templates.
KV_TEMPLATES = (
    ("past_key_values.%d.key", "past_key_values.%d.value", "present.%d.key", "present.%d.value"),
    ("past_key_%d_in", "past_value_%d_in", "past_key_%d_out", "past_value_%d_out"),
)
SEQ_INPUTS = ("past_seq_len", "total_seq_len")
# QNN provider options that shape the compile, not the run: the built folder's stages don't carry
# the exporter's values for them.
COMPILE_ONLY_QNN = frozenset({"soc_model", "htp_arch", "htp_graph_finalization_optimization_mode", "vtcm_mb",
                              "enable_htp_weight_sharing", "backend_path", "backend_type", "enable_htp_fp16_precision"})
_OPTION_KEY_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
# The twin's fixed prompt (greedy generation from it on the CPU EP and on the simulator).
TWIN_PROMPT = "The farm builds context binaries"
TWIN_TOKENS = 16
# The --require-twin gate on each part's check (prefill and one decode step on the simulator
# against the CPU EP): every output at or above this PSNR. fp16 rounding of a well-scaled graph
# gives 60-100 dB (the bench export, hidden 1024: 73.5-96 dB; the tiny test export likewise); a
# broken graph or an fp16 overflow falls far below it. The figure --min-psnr's own hint gives.
TWIN_MIN_PSNR = 30.0
HINT = ("an export folder as Olive's QNN recipe or AI Hub leaves it: genai_config.json (decoder-pipeline), "
        "tokenizer files, CPU stages and per part a prefill and a decode graph (docs/shipping-llm.md)")


# ---- the description ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Graph:
    """One .onnx of the export: its file name in the folder (checked), its graph inputs and
    outputs (name, shape with a symbolic dim as its name, ONNX dtype number) and the
    external-data files it references (checked names relative to the folder, in first-use
    order)."""

    file: str
    inputs: tuple[tuple[str, tuple[Any, ...], int], ...]
    outputs: tuple[tuple[str, tuple[Any, ...], int], ...]
    data: tuple[str, ...]
    epcontext: bool = False  # holds an EPContext node (already compiled)

    @property
    def input_names(self) -> list[str]:
        return [n for n, _, _ in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [n for n, _, _ in self.outputs]

    def shape(self, name: str) -> tuple[Any, ...] | None:
        for n, s, _ in (*self.inputs, *self.outputs):
            if n == name:
                return s
        return None


@dataclass(frozen=True)
class Stage:
    """One stage of the exporter's pipeline, in order. ``kind`` is ``prefill`` or ``decode``
    for a part's graph (``part`` its index from 0), else the CPU stage's role: ``embeddings``,
    ``lm_head`` or ``cpu`` (carried as it is: AI Hub's position processor, quantizers...).
    ``options`` are the stage's keys of the exporter's config other than filename, inputs,
    outputs and session_options (run_on_prompt, run_on_token_gen, is_lm_head, ...);
    ``qnn_options`` the runtime keys of its ``qnn`` provider options (``htp_performance_mode``
    ...; never the compile-time ones, ``COMPILE_ONLY_QNN``: the farm's build decides those)."""

    name: str
    kind: str
    graph: Graph
    part: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    qnn_options: Mapping[str, str] = field(default_factory=dict)  # the exporter's runtime QNN options

    @property
    def role(self) -> str:
        """The manifest's role: ``part0.prefill``, ``part1.decode``, ``embeddings``, ``lm_head``,
        ``cpu.<stage name>``."""
        if self.part is not None:
            return f"part{self.part}.{self.kind}"
        return self.kind if self.kind in ("embeddings", "lm_head") else f"cpu.{self.name}"


@dataclass(frozen=True)
class Part:
    """A part: its prefill and decode stages (compiled together as one weight-shared group) and
    the external-data files they share, and the KV-cache layers it holds."""

    index: int
    prefill: Stage
    decode: Stage
    data: tuple[str, ...]
    layers: tuple[int, ...]


@dataclass(frozen=True)
class KvCache:
    """The KV cache as the graphs declare it: the name templates (``%d`` the layer), the layer
    count, the window (the prefill length W) and the cache length C (the past KV's sequence dim:
    ``search.max_length`` may not exceed it)."""

    past_key: str
    past_value: str
    present_key: str
    present_value: str
    layers: int
    window: int
    length: int
    kv_heads: int | None
    head_size: int | None


@dataclass(frozen=True)
class GenaiExport:
    """An export folder as the farm sees it (``read_export``). ``stages`` is the pipeline in the
    exporter's order; ``parts`` the part graphs by index; ``cpu`` the CPU stages; ``tokenizer``
    the tokenizer files present; ``config`` the exporter's parsed genai_config.json."""

    root: Path
    layout: str
    config: dict[str, Any]
    stages: tuple[Stage, ...]
    parts: tuple[Part, ...]
    cpu: tuple[Stage, ...]
    tokenizer: tuple[str, ...]
    kv: KvCache

    @property
    def window(self) -> int:
        return self.kv.window

    def carried_files(self) -> list[str]:
        """Files the package takes as they are: CPU stages and their external data, tokenizer
        files. (The parts' graphs and data are compiled, not carried.)"""
        out: list[str] = []
        for s in self.cpu:
            for f in (s.graph.file, *s.graph.data):
                if f not in out:
                    out.append(f)
        return out + [t for t in self.tokenizer if t not in out]

    def path(self, name: str) -> Path:
        """``root/name`` for a file this description names (re-checked to stay inside)."""
        return _inside(self.root, name, name)

    def group_members(self, index: int) -> list[tuple[str, str]]:
        """The part's weight-shared group for ``farm.core.groups.inspect_group``:
        ``[("prefill", path), ("decode", path)]``."""
        p = self.parts[index]
        return [("prefill", str(self.path(p.prefill.graph.file))), ("decode", str(self.path(p.decode.graph.file)))]


# ---- reading an export ----------------------------------------------------------------------------

def _bad(message: str, hint: str | None = HINT) -> BadGenaiError:
    return BadGenaiError(message, hint=hint)


def _shown(v: Any) -> str:
    s = v if isinstance(v, str) else repr(v)
    return repr(s[:80] + ("..." if len(s) > 80 else ""))


def check_file_name(name: Any, where: str) -> str:
    """A file name from the folder or its config: a plain name matching ``FILE_NAME_RE``."""
    if not isinstance(name, str) or not FILE_NAME_RE.fullmatch(name) or name in (".", ".."):
        raise _bad(f"{where}: file name {_shown(name)} is not allowed (a plain file name in the export folder: "
                   "letters, digits, '_', '.', '+', '-', no directory)")
    return name


def _inside(root: Path, name: str, where: str) -> Path:
    try:
        return inside(root, name)
    except UnsafePathError as exc:
        raise _bad(f"{where}: {exc}") from None


def _regular(root: Path, name: str, where: str, *, limit: int) -> Path:
    """``root/name``, a readable regular file inside the folder of at most ``limit`` bytes
    (``farm.core.names.input_file``: a loop, a dangling symlink, a FIFO, permission denied...
    are refused naming the file)."""
    p = _inside(root, name, where)
    try:
        st = input_file(p)
    except UnusablePathError as exc:
        if exc.missing:
            raise _bad(f"{where}: {name} is missing from the export folder") from None
        raise _bad(f"{where}: {name} can't be read: {exc.reason}") from None
    if st.st_size > limit:
        raise _bad(f"{name}: {st.st_size} bytes, over the {limit}-byte limit for this file")
    return p


def read_config(root: Path) -> dict[str, Any]:
    """The exporter's genai_config.json, bounded and shape-checked: a decoder-pipeline whose
    ``model.decoder.pipeline`` is a list of one object of stages."""
    doc = _read_json(root, CONFIG_FILE, MAX_CONFIG_BYTES)
    model = doc.get("model") if isinstance(doc, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(model, dict) or not isinstance(decoder, dict):
        raise _bad(f"{CONFIG_FILE} has no model.decoder object")
    if model.get("type") != "decoder-pipeline":
        raise _bad(f"{CONFIG_FILE}: model.type is {_shown(model.get('type'))}, not 'decoder-pipeline' "
                   "(a static split pipeline)",
                   hint="export with Olive's QNN recipe (StaticLLM + SplitModel) or AI Hub's genai export")
    pipeline = decoder.get("pipeline")
    if (not isinstance(pipeline, list) or len(pipeline) != 1 or not isinstance(pipeline[0], dict)
            or not pipeline[0] or len(pipeline[0]) > MAX_STAGES):
        raise _bad(f"{CONFIG_FILE}: model.decoder.pipeline must be a list holding one object of "
                   f"1 to {MAX_STAGES} stages")
    try:
        genai_schema.check_config(doc)
    except jsonspec.SpecError as exc:
        raise _bad(f"{CONFIG_FILE}: {exc.path}: {exc.problem}",
                   hint="each key of genai_config.json holds what onnxruntime-genai reads there (docs/shipping-llm.md: "
                        "what the farm checks)") from None
    return doc


def _read_json(root: Path, name: str, limit: int) -> Any:
    """A JSON file of the folder, bounded and parsed strictly (``farm.core.jsonspec.loads``: no
    NaN/Infinity, no key twice)."""
    p = _regular(root, name, name, limit=limit)
    try:
        with open(p, "rb") as f:
            raw = f.read(limit + 1)
        return jsonspec.loads(raw)
    except OSError as exc:  # changed since it was checked
        raise _bad(f"{name} can't be read: {exc.strerror or type(exc).__name__}") from None
    except jsonspec.SpecError as exc:
        raise _bad(f"{name}: {exc.path or '(the document)'}: {exc.problem}") from None
    except (UnicodeError, ValueError, RecursionError) as exc:
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise _bad(f"{name} is not valid JSON ({why})") from None


def read_graph(root: Path, name: str, *, weights: bool = True) -> Graph:
    """A graph's I/O and external-data references, from the .onnx alone (never its weights).
    ``weights=False``: the external-data files are named and their names checked, not looked for
    on disk (``read_export``)."""
    import onnx
    from onnx import external_data_helper

    p = _regular(root, name, name, limit=MAX_GRAPH_BYTES)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, RuntimeError, ValueError...
        raise _bad(f"{name}: not an ONNX model ({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__})",
                   hint=None) from None
    if not model.HasField("graph") or not model.graph.node:
        raise _bad(f"{name}: not an ONNX model (no graph or no nodes)", hint=None)
    inits = {i.name for i in model.graph.initializer}

    def one(v: Any) -> tuple[str, tuple[Any, ...], int]:
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
        return v.name, dims, int(t.elem_type)

    data: list[str] = []
    for t in external_data_helper._get_all_tensors(model):  # noqa: SLF001 (onnx's own walker)
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        try:
            rel = str(canonical_relative(loc))
        except UnsafePathError as exc:
            raise _bad(f"{name}: external data {exc}", hint=None) from None
        check_file_name(rel, f"{name}: external data")
        here = name.rpartition("/")[0]  # relative to the graph's own folder
        rel = f"{here}/{rel}" if here else rel
        if rel not in data:
            if weights:
                _regular(root, rel, f"{name}: external data", limit=1 << 62)
            data.append(rel)
    epc = any(n.op_type == "EPContext" for n in model.graph.node)
    graph = Graph(name, tuple(one(v) for v in model.graph.input if v.name not in inits),
                  tuple(one(v) for v in model.graph.output), tuple(data), epc)
    for key, names in (("inputs", graph.input_names), ("outputs", graph.output_names)):
        try:  # they go into the generated config as its stage's inputs/outputs: the config's own spec
            jsonspec.check(names, genai_schema.IO_NAMES)
        except jsonspec.SpecError as exc:
            raise _bad(f"{name}: graph {key}{exc.path}: {exc.problem}", hint=None) from None
    return graph


def _classify(file: str) -> tuple[str, str, int, dict[str, int]] | None:
    """(layout, prefill|decode, part index from 0, extra) of a part graph's file name."""
    m = OLIVE_RE.fullmatch(file)
    if m:
        return "olive", "prefill" if m[1] == "context" else "decode", int(m[2] or 0), {"single": int(m[2] is None)}
    m = AIHUB_RE.fullmatch(file)
    if m:
        return ("aihub", "prefill" if m[1] == "prompt" else "decode", int(m[4]) - 1,
                {"ar": int(m[2]), "cl": int(m[3]), "of": int(m[5]), "i": int(m[4])})
    return None


def _cpu_kind(name: str, spec: Mapping[str, Any], graph: Graph) -> str:
    if spec.get("is_lm_head") is True or name == "lm_head" or "logits" in graph.output_names:
        return "lm_head"
    if name in ("embeddings", "embedding") or "input_ids" in graph.input_names:
        return "embeddings"
    return "cpu"


def _kv_of(graph: Graph) -> tuple[int, dict[int, int]] | None:
    """(template index, {layer: 4 names found}) of a graph's KV names, or None without KV."""
    for ti, (pk, pv, ck, cv) in enumerate(KV_TEMPLATES):
        rx = [re.compile(re.escape(t).replace("%d", r"(\d{1,4})")) for t in (pk, pv, ck, cv)]
        found: dict[int, int] = {}
        for names, pair in ((graph.input_names, rx[:2]), (graph.output_names, rx[2:])):
            for n in names:
                for r in pair:
                    m = r.fullmatch(n)
                    if m:
                        found[int(m[1])] = found.get(int(m[1]), 0) + 1
        if found:
            return ti, found
    return None


def read_export(path: str | os.PathLike[str], *, weights: bool = True) -> GenaiExport:
    """Read an export folder into a ``GenaiExport``. Raises ``BadGenaiError`` naming the file for:
    no folder, no or bad ``genai_config.json`` (not JSON, over 1 MiB, not a decoder-pipeline), a
    stage file that is missing, not ONNX or badly named (a directory, ``..``, absolute), external
    data that escapes or is missing, an unknown or mixed layout, parts missing a prefill or a
    decode graph or numbered with gaps, a part whose prefill and decode differ in I/O names,
    parts that share KV layers, a window that differs between parts, no tokenizer.json; a value
    of genai_config.json of the wrong JSON type or out of range (``farm.core.genai_schema``,
    named by its JSON path), a tokenizer JSON file that is not one, KV or window shapes out of
    range; a file (or the folder) that is a symlink loop, a dangling symlink, a FIFO or device,
    unreadable (``farm.core.names.input_file``). ``weights=False``: the graphs' external data is not
    required on disk (a stored package laid out for its assembly, which reads no weight; its
    snapshot was read with its weights when it was submitted)."""
    given = Path(path)
    try:
        root = input_folder(given)
    except UnusablePathError as exc:
        if exc.missing:
            raise _bad(f"{given}: no such folder (an export is a folder with {CONFIG_FILE})") from None
        raise _bad(f"{given}: not a folder to read ({exc.reason}); an export is a folder with {CONFIG_FILE}") from None
    try:
        with os.scandir(root) as it:
            names = []
            for i, e in enumerate(it):
                if i >= MAX_ENTRIES:
                    raise _bad(f"{root}: more than {MAX_ENTRIES} entries, not an export folder")
                names.append(e.name)
    except OSError as exc:
        raise _bad(f"{given}: cannot list the folder ({exc.strerror or exc})") from None
    if CONFIG_FILE not in names:
        raise _bad(f"{given}: {CONFIG_FILE} is missing (the exporter's config: Olive and AI Hub both write one)")
    config = read_config(root)
    spec_stages = config["model"]["decoder"]["pipeline"][0]

    stages: list[Stage] = []
    layouts: set[str] = set()
    extra: dict[tuple[int, str], dict[str, int]] = {}
    seen_files: set[str] = set()
    for name, spec in spec_stages.items():
        where = f"{CONFIG_FILE}: stage {_shown(name)}"
        if not STAGE_NAME_RE.fullmatch(name):  # it becomes a role in the manifest
            raise _bad(f"{where}: a stage name is letters, digits, '_', '.', '-' (at most 64)")
        if not isinstance(spec, dict):
            raise _bad(f"{where} is not an object")
        file = check_file_name(spec.get("filename"), where)
        if file in seen_files:
            raise _bad(f"{where}: {file} is used by two stages")
        seen_files.add(file)
        graph = read_graph(root, file, weights=weights)
        if graph.epcontext:
            raise _bad(f"{file}: already compiled (holds an EPContext node); give the export before compiling",
                       hint="farm builds from the exporter's ONNX graphs, not from _ctx.onnx files")
        for key in ("inputs", "outputs"):
            listed = spec.get(key)
            actual = graph.input_names if key == "inputs" else graph.output_names
            if listed is not None and (not isinstance(listed, list) or sorted(map(str, listed)) != sorted(actual)):
                raise _bad(f"{where}: its {key} in {CONFIG_FILE} are not {file}'s graph {key} "
                           f"({_shown(listed)} vs {_shown(actual)})")
        options = {k: v for k, v in spec.items() if k not in ("filename", "inputs", "outputs", "session_options")}
        qnn = _runtime_qnn(spec.get("session_options"))
        cls = _classify(file)
        if cls is None:
            stages.append(Stage(str(name), _cpu_kind(str(name), spec, graph), graph, None, options, qnn))
            continue
        layout, kind, part, ex = cls
        layouts.add(layout)
        if (part, kind) in extra:
            raise _bad(f"{file}: part {part}'s {kind} graph is listed twice")
        extra[(part, kind)] = ex
        stages.append(Stage(str(name), kind, graph, part, options, qnn))
    if not layouts:
        raise _bad(f"{CONFIG_FILE}: no stage is a part graph: unknown layout (expected context_<i>.onnx/"
                   "iterator_<i>.onnx from Olive or prompt_ar<W>_cl<C>_<i>_of_<N>.onnx/token_... from AI Hub)")
    if len(layouts) > 1:
        raise _bad(f"{CONFIG_FILE}: stages mix Olive's and AI Hub's part names; one exporter's layout only")
    layout = layouts.pop()

    # Parts: each index 0..N-1 has one prefill and one decode graph.
    by_part: dict[int, dict[str, Stage]] = {}
    for s in stages:
        if s.part is not None:
            by_part.setdefault(s.part, {})[s.kind] = s
    n = len(by_part)
    if n > MAX_PARTS:
        raise _bad(f"{CONFIG_FILE}: {n} parts, over the limit of {MAX_PARTS}")
    if sorted(by_part) != list(range(n)):
        raise _bad(f"{CONFIG_FILE}: parts are numbered {sorted(by_part)}, not {list(range(n))} "
                   f"({'from 1' if layout == 'aihub' else 'from 0'}, no gaps)")
    if layout == "olive" and n > 1 and any(e.get("single") for e in extra.values()):
        raise _bad(f"{CONFIG_FILE}: context.onnx/iterator.onnx (one part) next to numbered parts")
    if layout == "aihub" and {e["of"] for e in extra.values()} != {n}:
        raise _bad(f"{CONFIG_FILE}: AI Hub part names say '_of_{sorted({e['of'] for e in extra.values()})}', "
                   f"but {n} parts are listed")
    kv_template: int | None = None
    parts: list[Part] = []
    layer_owner: dict[int, int] = {}
    windows: dict[int, int] = {}
    kv_shape: tuple[Any, ...] | None = None
    for i in range(n):
        pair = by_part[i]
        for kind in ("prefill", "decode"):
            if kind not in pair:
                other = next(iter(pair.values())).graph.file
                raise _bad(f"{other}: part {i} has no {kind} graph in {CONFIG_FILE} "
                           f"(each part is a prefill and a decode graph)")
        pre, dec = pair["prefill"], pair["decode"]
        if sorted(pre.graph.input_names) != sorted(dec.graph.input_names) or \
                sorted(pre.graph.output_names) != sorted(dec.graph.output_names):
            raise _bad(f"{dec.graph.file}: its inputs/outputs differ from {pre.graph.file}'s "
                       "(a part's prefill and decode graphs have the same I/O names)")
        kv = _kv_of(pre.graph)
        if kv is None:
            raise _bad(f"{pre.graph.file}: no KV-cache inputs/outputs (past_key_values.<l>.key ... present.<l>.key, "
                       "or past_key_<l>_in ... past_key_<l>_out)")
        ti, found = kv
        if kv_template is None:
            kv_template = ti
        elif ti != kv_template:
            raise _bad(f"{pre.graph.file}: KV-cache names follow another convention than part 0's")
        bad_layers = sorted(layer for layer, count in found.items() if count != 4)
        if bad_layers:
            raise _bad(f"{pre.graph.file}: layer {bad_layers[0]} lacks one of its past/present key/value names")
        for layer in found:
            if layer in layer_owner:
                raise _bad(f"{pre.graph.file}: KV layer {layer} is also in part {layer_owner[layer]} "
                           "(parts hold disjoint layers)")
            layer_owner[layer] = i
        pk = KV_TEMPLATES[ti][0] % min(found)
        pshape, dshape = pre.graph.shape(pk), dec.graph.shape(pk)
        # [batch, kv_heads, length, head_size]: heads and head size fixed; the length fixed too
        # (a cache of C positions) or symbolic (Olive leaves past_sequence_length: genai then
        # sizes the cache from the config's context_length).
        if (not pshape or len(pshape) != 4 or not _within(pshape[1], 1, MAX_HEADS)
                or not _within(pshape[3], 1, MAX_HEAD_SIZE)
                or not (_within(pshape[2], 1, MAX_CONTEXT) or isinstance(pshape[2], str))):
            raise _bad(f"{pre.graph.file}: {pk} is not a [batch, kv_heads, length, head_size] tensor with fixed "
                       f"heads (1 to {MAX_HEADS}) and head size (1 to {MAX_HEAD_SIZE}), a length from 1 to "
                       f"{MAX_CONTEXT} or symbolic ({_shown(pshape)})")
        if dshape != pshape:
            raise _bad(f"{dec.graph.file}: {pk} is {_shown(dshape)}, {pre.graph.file} has {_shown(pshape)}")
        if kv_shape is None:
            kv_shape = pshape
        windows[i] = _seq_len(pre.graph, f"part {i}'s prefill")
        if _seq_len(dec.graph, f"part {i}'s decode") != 1:
            raise _bad(f"{dec.graph.file}: a decode graph takes one token (sequence length 1)")
        data = tuple(dict.fromkeys((*pre.graph.data, *dec.graph.data)))
        parts.append(Part(i, pre, dec, data, tuple(sorted(found))))
    if sorted(layer_owner) != list(range(len(layer_owner))):
        raise _bad(f"{CONFIG_FILE}: the parts' KV layers are {sorted(layer_owner)}, not 0..{len(layer_owner) - 1}")
    if len(set(windows.values())) != 1:
        raise _bad(f"{parts[-1].prefill.graph.file}: prefill lengths differ between parts ({windows}): "
                   "one window for the pipeline")
    window = windows[0]
    if window < 2:
        raise _bad(f"{parts[0].prefill.graph.file}: a prefill graph takes more than one token")
    assert kv_template is not None and kv_shape is not None
    pk, pv, ck, cv = KV_TEMPLATES[kv_template]
    length = kv_shape[2]
    if not isinstance(length, int):
        length = config["model"].get("context_length")  # checked by genai_schema: null or 1..MAX_CONTEXT
        if length is None:
            raise _bad(f"{parts[0].prefill.graph.file}: the KV cache length is symbolic ({_shown(kv_shape[2])}) and "
                       f"{CONFIG_FILE} has no model.context_length to size it")
    kvc = KvCache(pk, pv, ck, cv, len(layer_owner), window, length, kv_shape[1], kv_shape[3])
    if kvc.length < window:
        raise _bad(f"{parts[0].prefill.graph.file}: KV length {kvc.length} is shorter than the window {window}")

    if layout == "aihub":  # the names say the window and the cache length: they must be the graphs'
        for p in parts:
            for st, ar in ((p.prefill, window), (p.decode, 1)):
                ex = extra[(p.index, st.kind)]
                if ex["ar"] != ar or ex["cl"] != kvc.length:
                    raise _bad(f"{st.graph.file}: its name says ar{ex['ar']} cl{ex['cl']}, its graph is "
                               f"ar{ar} cl{kvc.length}")
    cpu = tuple(s for s in stages if s.part is None)
    if not any(s.kind == "lm_head" for s in cpu):
        raise _bad(f"{CONFIG_FILE}: no lm_head stage (is_lm_head, or a stage whose output is 'logits')")
    tokenizer = tuple(t for t in TOKENIZER_FILES if t in names)
    if "tokenizer.json" not in tokenizer and "tokenizer.model" not in tokenizer:
        raise _bad(f"{root}: tokenizer.json is missing (onnxruntime-genai loads the tokenizer from the folder)")
    for t in tokenizer:
        if t in genai_schema.TOKENIZER_JSON:
            try:
                jsonspec.check(_read_json(root, t, MAX_TOKENIZER_BYTES), genai_schema.TOKENIZER_JSON[t])
            except jsonspec.SpecError as exc:
                raise _bad(f"{t}: {exc.path or '(the document)'}: {exc.problem}",
                           hint="the tokenizer files as the model's tokenizer saved them "
                                "(tokenizer.save_pretrained)") from None
        else:
            _regular(root, t, t, limit=MAX_TOKENIZER_BYTES)
    export = GenaiExport(root, layout, config, tuple(stages), tuple(parts), cpu, tokenizer, kvc)
    # The config the package will ship, made once now: a value it can't use fails here, before
    # anything is queued, not in the assembly after every part compiled.
    genai_config(export, package_layout(export))
    return export


def _within(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _runtime_qnn(session_options: Any) -> dict[str, str]:
    """The runtime keys of a stage's ``qnn`` provider options (plain keys, scalar values, at
    most 32); anything else in the exporter's session options is left behind."""
    provs = session_options.get("provider_options") if isinstance(session_options, dict) else None
    out: dict[str, str] = {}
    for p in provs if isinstance(provs, list) else []:
        qnn = p.get("qnn") if isinstance(p, dict) else None
        for k, v in (qnn.items() if isinstance(qnn, dict) else ()):
            if (len(out) < 32 and isinstance(k, str) and _OPTION_KEY_RE.fullmatch(k) and k not in COMPILE_ONLY_QNN
                    and isinstance(v, str | int | bool) and len(str(v)) <= 128):
                out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _seq_len(graph: Graph, what: str) -> int:
    """The sequence length of a part graph: dim 1 of its first input that is not KV or a
    sequence-length scalar (inputs_embeds [1, S, H], input_ids [1, S])."""
    for name, shape, _ in graph.inputs:
        if name in SEQ_INPUTS or any(re.fullmatch(re.escape(t).replace("%d", r"\d+"), name)
                                     for tpl in KV_TEMPLATES for t in tpl[:2]):
            continue
        if len(shape) >= 2 and _within(shape[1], 1, MAX_CONTEXT):
            return int(shape[1])
        raise _bad(f"{graph.file}: {what} input {name!r} has no static sequence length ({_shown(shape)})")
    raise _bad(f"{graph.file}: {what} has no hidden-state or token input")


# ---- the folder that ships -----------------------------------------------------------------------

def roles(export: GenaiExport) -> dict[str, str]:
    """Stage name -> role, in pipeline order: ``part<i>.prefill``, ``part<i>.decode``,
    ``embeddings``, ``lm_head``, ``cpu.<stage name>`` (``Stage.role``)."""
    return {s.name: s.role for s in export.stages}


def _stem(file: str) -> str:
    return file[:-5] if file.endswith(".onnx") else file


def package_layout(export: GenaiExport) -> dict[str, str]:
    """Stage name -> its file in the package (flat, the exporter's names): a part graph
    ``context_0.onnx`` ships compiled as ``context_0_ctx.onnx``, a CPU stage as it is. Pass it to
    ``genai_config``. The part's shared binary is ``part_binary``'s name."""
    return {s.name: s.graph.file if s.part is None else f"{_stem(s.graph.file)}_ctx.onnx" for s in export.stages}


def part_binary(export: GenaiExport, index: int, k: int = 0) -> str:
    """Part ``index``'s ``k``-th context binary in the package, named after its prefill graph:
    ``context_0_ctx_qnn.bin`` (then ``_1``... should the EP write several). Renaming a binary
    means rewriting ``ep_cache_context`` in the context models that point at it."""
    stem = _stem(export.parts[index].prefill.graph.file)
    return f"{stem}_ctx_qnn.bin" if k == 0 else f"{stem}_ctx_qnn_{k}.bin"


def qnn_provider_options(extra: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """A QNN stage's provider options in genai_config.json: the HTP backend (genai adds
    ``ep.share_ep_contexts=1`` to QNN sessions itself)."""
    return [{"qnn": {"backend_type": "htp", **(dict(extra) if extra else {})}}]


def genai_config(export: GenaiExport, files: Mapping[str, str], *,
                 provider_options: list[dict[str, Any]] | None = None,
                 max_length: int | None = None) -> dict[str, Any]:
    """The genai_config.json of a folder holding ``export``'s stages at ``files[stage name]``
    (every stage must be mapped; a name is a plain file name). Part stages get
    ``provider_options`` in their session options (default: ``qnn_provider_options`` with the
    stage's runtime ``qnn_options`` from the exporter; ``[]`` runs them on the CPU EP, as the
    source pipeline is run for the twin); CPU stages none. The
    decoder-level provider list is empty so the KV cache stays on the CPU; the KV names, window
    (``sliding_window``, alignment left) and ``past_seq_len``/``total_seq_len`` come from the
    graphs, the rest (token ids, search, sizes) from the exporter's config, ``search.max_length``
    capped at the KV length. Raises ``BadGenaiError`` for an unmapped stage or a bad name."""
    doc = _without_nulls(copy.deepcopy(export.config))
    model = doc["model"]
    model["type"] = "decoder-pipeline"
    dec = model["decoder"]
    dec.pop("filename", None)
    dec["session_options"] = {**(dec.get("session_options") if isinstance(dec.get("session_options"), dict) else {}),
                              "provider_options": []}
    kv = export.kv
    inputs = dict(dec.get("inputs") if isinstance(dec.get("inputs"), dict) else {})
    inputs.update({"past_key_names": kv.past_key, "past_value_names": kv.past_value})
    graph_inputs = {n for p in export.parts for n in p.prefill.graph.input_names}
    if "past_seq_len" in graph_inputs:
        inputs["past_sequence_length"] = "past_seq_len"
    if "total_seq_len" in graph_inputs:
        inputs["total_sequence_length"] = "total_seq_len"
    dec["inputs"] = inputs
    outputs = dict(dec.get("outputs") if isinstance(dec.get("outputs"), dict) else {})
    outputs.update({"present_key_names": kv.present_key, "present_value_names": kv.present_value})
    dec["outputs"] = outputs
    sw = dict(dec.get("sliding_window") if isinstance(dec.get("sliding_window"), dict) else {})
    sw.pop("slide_inputs", None)
    sw.update({"window_size": kv.window, "alignment": "left"})
    sw.setdefault("pad_value", 0)
    sw.setdefault("slide_key_value_cache", False)
    dec["sliding_window"] = sw
    dec["num_hidden_layers"] = kv.layers
    if kv.kv_heads:
        dec["num_key_value_heads"] = kv.kv_heads
    if kv.head_size:
        dec["head_size"] = kv.head_size
    search = dict(doc["search"]) if isinstance(doc.get("search"), dict) else {}
    doc["search"] = search
    # Both checked by genai_schema (an integer from 1, or absent: nulls are gone); capped at the KV.
    want: Any = max_length or search.get("max_length")
    search["max_length"] = min(int(want), kv.length) if _within(want, 1, MAX_CONTEXT) else kv.length
    ctx: Any = model.get("context_length")
    model["context_length"] = min(int(ctx), kv.length) if _within(ctx, 1, MAX_CONTEXT) else kv.length
    stages: dict[str, Any] = {}
    for s in export.stages:
        if s.name not in files:
            raise _bad(f"stage {s.name!r} ({s.graph.file}) has no file in the package")
        entry: dict[str, Any] = {"filename": check_file_name(files[s.name], f"stage {s.name!r}"),
                                 "inputs": s.graph.input_names, "outputs": s.graph.output_names}
        entry.update({k: v for k, v in s.options.items() if k != "session_options"})
        if s.part is not None:
            opts = qnn_provider_options(s.qnn_options) if provider_options is None else provider_options
            entry["session_options"] = {"provider_options": copy.deepcopy(opts)}
            entry["run_on_prompt"] = s.kind == "prefill"
            entry["run_on_token_gen"] = s.kind == "decode"
        if s.kind == "lm_head":
            entry["is_lm_head"] = True
        stages[s.name] = entry
    dec["pipeline"] = [stages]
    return doc


def _without_nulls(doc: Any) -> Any:
    """The config less its ``null`` values: an exporter writes null for what it did not know
    (Olive: ``eos_token_id``, ``search.temperature`` of a model without a generation config),
    and onnxruntime-genai refuses a null where it expects a number; absent, its default holds."""
    if isinstance(doc, dict):
        return {k: _without_nulls(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [_without_nulls(v) for v in doc]
    return doc


def config_bytes(doc: Mapping[str, Any]) -> bytes:
    """A config as written into the folder: indented, keys in their order. Never sorted: genai
    runs ``decoder.pipeline[0]``'s stages in the object's key order."""
    return (json.dumps(doc, indent=2) + "\n").encode()


# ---- a built folder, read back (onnx only: a device or an installer can run it) ------------------

@dataclass(frozen=True)
class FolderStage:
    """A stage of a built folder: its file, the external data and context binaries it points
    at (checked to exist inside the folder), and its EPContext nodes' names (the graph names
    inside those binaries)."""

    name: str
    file: str
    data: tuple[str, ...]
    binaries: tuple[str, ...]
    contexts: tuple[str, ...]
    run_on_prompt: bool
    run_on_token_gen: bool


def inspect_folder(path: str | os.PathLike[str], *,
                   elsewhere: Collection[str] = ()) -> tuple[dict[str, Any], list[FolderStage]]:
    """Check a built genai folder without a runtime: ``genai_config.json`` is a decoder-pipeline,
    every file its stages name exists inside the folder, every external-data reference and every
    EPContext ``ep_cache_context`` (embed_mode 0) resolves to a file inside it (or, for a binary
    the caller holds elsewhere, named in ``elsewhere``: its name is still checked), the tokenizer
    is there. Returns (config,
    stages in order); raises ``GenaiFolderError`` (``genai-folder-invalid``) naming the file.
    What it can't tell (the config's schema, a binary's graphs) is ``workers.qnn.genai``'s."""
    import onnx

    from farm.core.errors import GenaiFolderError

    try:
        root = input_folder(Path(path))
    except UnusablePathError as exc:
        raise GenaiFolderError(f"{path}: not a folder to read ({exc.reason})") from None
    try:
        config = read_config(root)
    except BadGenaiError as exc:
        raise GenaiFolderError(exc.message) from None
    out: list[FolderStage] = []
    for name, spec in config["model"]["decoder"]["pipeline"][0].items():
        where = f"{CONFIG_FILE}: stage {_shown(name)}"
        try:
            if not isinstance(spec, dict):
                raise _bad(f"{where} is not an object")
            file = check_file_name(spec.get("filename"), where)
            graph = read_graph(root, file)
        except BadGenaiError as exc:
            raise GenaiFolderError(exc.message) from None
        here = file.rpartition("/")[0]  # EPContext and external-data paths are relative to it
        model = onnx.load(str(root / file), load_external_data=False)
        bins: list[str] = []
        nodes: list[str] = []
        for node in model.graph.node:
            if node.op_type != "EPContext":
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
                     if a.name in ("embed_mode", "ep_cache_context")}
            nodes.append(node.name)
            if attrs.get("embed_mode", 1) != 0:
                continue
            main = next((a.i for a in node.attribute if a.name == "main_context"), 1)
            if main == 0 and "ep_cache_context" not in attrs:
                continue  # another partition of this model: its graph is in its main node's binary
            raw = attrs.get("ep_cache_context", b"")
            rel = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            try:
                check_file_name(rel, f"{file}: EPContext node {node.name!r}")
                rel = f"{here}/{rel}" if here else rel
                if rel not in elsewhere:
                    _regular(root, rel, f"{file}: EPContext node {node.name!r}", limit=1 << 62)
            except BadGenaiError as exc:
                raise GenaiFolderError(exc.message, hint="every EPContext node of the folder points at a "
                                       "context binary beside it") from None
            if rel not in bins:
                bins.append(rel)
        out.append(FolderStage(str(name), file, graph.data, tuple(bins), tuple(nodes),
                               spec.get("run_on_prompt", True) is not False,
                               spec.get("run_on_token_gen", True) is not False))
    if not any((root / t).is_file() for t in ("tokenizer.json", "tokenizer.model")):
        raise GenaiFolderError(f"{root}: tokenizer.json is missing (og.Tokenizer(model) loads it from the folder)")
    return config, out


def shared_binaries(stages: list[FolderStage]) -> dict[str, list[FolderStage]]:
    """Context binary -> the stages whose EPContext nodes point at it, in pipeline order."""
    out: dict[str, list[FolderStage]] = {}
    for s in stages:
        for b in s.binaries:
            out.setdefault(b, []).append(s)
    return out
