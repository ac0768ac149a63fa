"""A tiny random-weight Llama-shaped decoder, exported as a static decoder pipeline with a KV
cache, laid out as exporters leave it for onnxruntime-genai on a Snapdragon NPU.

    python bench/genai_export.py OUT --parts 2                       # Olive's QNN recipe layout
    python bench/genai_export.py OUT --parts 2 --layout aihub        # AI Hub's part naming
    python bench/genai_export.py OUT --parts 2 --hidden 1024 --layers 16   # bigger (bench/genai.py)
    python bench/genai_export.py OUT --parts 2 --exporter olive --python VENV/bin/python  # Olive itself

Two ways to write it:

- ``--exporter olive``: **the real exporter**. A random-weight Qwen2 (transformers, created
  here, nothing downloaded) through Olive 0.13's static passes: CaptureSplitInfo (``--parts``),
  ModelBuilder (fp32), GraphSurgeries (RemoveRopeMultiCache, AttentionMaskToSequenceLengths,
  SimplifiedLayerNormToL2Norm), SplitModel, StaticLLM (``--window``): Olive's QNN recipe less
  its quantization and EPContext passes. Needs an environment of its own, given as
  ``--python``: ``pip install torch==2.13.0 transformers olive-ai==0.13.0 onnxruntime==1.31.1
  onnxruntime-genai==0.11.2 requests`` (Olive 0.13's ModelBuilder pass imports
  ``onnxruntime_genai.models.quantized_model``, which genai 0.18 no longer has; measured). Its
  part graphs keep GroupQueryAttention (the QNN EP leaves it on the CPU) and a symbolic KV
  length (genai sizes the cache from ``context_length``). ``tests/data/genai/olive-qwen2-tiny``
  was written this way.
- ``--exporter helper`` (the default, needs only onnx and numpy): the same layout written with
  onnx.helper, every op one the HTP takes (no GroupQueryAttention), a fixed KV length. It
  follows Olive's output (compared with what Olive 0.13 wrote here): file names, the shared
  ``context_<i>.onnx.data``, the KV and sequence-length I/O names and the genai_config.json
  (Olive's ``static_llm.py`` and ``passes/onnx/common.py``: ``update_llm_pipeline_genai_config``);
  differences from the real one: the hidden state crosses parts as one tensor (Olive's split
  passes the residual stream as two), the KV length is fixed, ``total_seq_len`` is [1] (Olive's
  is a scalar; genai feeds either).

onnxruntime-genai 0.18.0's own model builder (``onnxruntime_genai.models.builder``) runs here
too but emits one dynamic-shaped graph (GroupQueryAttention), not a static split pipeline.

The helper's layouts:

- ``--layout olive``: ``embeddings.onnx`` (input_ids -> inputs_embeds, CPU), per part i
  ``context_<i>.onnx`` (prefill, ``--window`` tokens) and ``iterator_<i>.onnx`` (decode, one
  token) both referencing ``context_<i>.onnx.data`` (as Olive 0.13 names it),
  ``lm_head.onnx`` (-> logits, CPU). Part inputs: the hidden state, ``past_key_values.<l>.key``
  / ``.value`` [1, kv_heads, context, head_size], ``past_seq_len`` [1,1] int32,
  ``total_seq_len`` [1] int32 (StaticLLM's GQA contract); outputs: the hidden state and
  ``present.<l>.key`` / ``.value`` of the same shape (genai's shared past/present buffer).
  genai_config.json: a ``decoder-pipeline`` whose stages are embeddings, context_*, iterator_*,
  lm_head with ``run_on_token_gen: false`` / ``run_on_prompt: false`` and the recipe's QNN
  session options, ``sliding_window`` {window_size W, alignment left, pad_value = pad token},
  ``past_sequence_length``/``total_sequence_length`` inputs.
- ``--layout aihub``: AI Hub's names: ``prompt_ar<W>_cl<C>_<i>_of_<N>.onnx`` and
  ``token_ar1_cl<C>_<i>_of_<N>.onnx`` (i from 1) sharing ``model_part_<i>_of_<N>.data``, KV
  names ``past_key_<l>_in`` / ``past_key_<l>_out``. Only the naming is AI Hub's: its CPU
  position-processor and quantizer stages and its sliding KV cache are not reproduced.

The model (per layer): RMSNorm, q/k/v projections, rotary embedding (as a MatMul with a fixed
rotation), the new keys/values written into the static cache at positions
``past_seq_len - S + 1 .. past_seq_len`` (a one-hot MatMul: no scatter op, all HTP-friendly),
causal attention over the cache, output projection, RMSNorm, a SwiGLU MLP; the last part ends
with the final RMSNorm. The tokenizer is a byte-level BPE (GPT-2 style tokenizer.json) whose
merges are learned here from a fixed text, nothing downloaded; ``<|endoftext|>`` is bos/eos and
``<|pad|>`` the pad token (genai pads prompt windows with it; it never occurs in a prompt).

Prints the files written and their sizes; ``--json`` prints them as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

CORPUS = (
    "The farm builds context binaries for a phone's NPU. A model is exported, split in parts, "
    "compiled on the simulator, checked by generating tokens, and shipped as one folder. "
    "Each part has a prefill graph and a decode graph sharing their weights. The device opens "
    "the folder with onnxruntime-genai and generates text one token at a time. 0123456789 "
    "Hello world! How are you today? The quick brown fox jumps over the lazy dog. "
)
BOS = "<|endoftext|>"
PAD = "<|pad|>"
PROMPT = "The farm builds context binaries"
# Stage boundaries are graph tensor names, as SplitModel cuts them (genai manages "inputs_embeds"
# itself: a stage output of that name is not passed on to the next stage).
EMBEDS = "/model/embed_tokens/Gather/output_0"
HIDDEN = "/model/norm/output_0"


# ---- tokenizer ------------------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def train_bpe(text: str, merges: int) -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE learned from ``text``: 256 byte tokens, then ``merges`` merges (within
    words, a word keeping its leading space as GPT-2's pre-tokenizer does)."""
    b2u = bytes_to_unicode()
    pieces = re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", text)
    words = Counter(tuple(b2u[b] for b in w.encode()) for w in pieces)
    vocab = {b2u[b]: b for b in range(256)}
    out: list[str] = []
    for _ in range(merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:], strict=False):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        out.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        new: Counter[tuple[str, ...]] = Counter()
        for w, c in words.items():
            merged: list[str] = []
            i = 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(w[i])
                    i += 1
            new[tuple(merged)] += c
        words = new
    return vocab, out


def write_tokenizer(out: Path, *, merges: int = 64, context: int) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json; returns the special ids
    and the vocab size."""
    vocab, merge_list = train_bpe(CORPUS, merges)
    bos, pad = len(vocab), len(vocab) + 1
    specials = [{"id": bos, "content": BOS}, {"id": pad, "content": PAD}]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{**s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True} for s in specials],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": {**vocab, BOS: bos, PAD: pad}, "merges": merge_list},
    }
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "add_bos_token": False, "add_prefix_space": False,
        "bos_token": BOS, "eos_token": BOS, "pad_token": PAD, "unk_token": BOS,
        "model_max_length": context, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(s["id"]): {"content": s["content"], "special": True, "lstrip": False,
                                                "rstrip": False, "normalized": False, "single_word": False}
                                 for s in specials},
    }, indent=1) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": BOS, "pad_token": PAD, "unk_token": BOS}, indent=1) + "\n")
    return {"bos": bos, "eos": bos, "pad": pad, "vocab": pad + 1}


# ---- graphs ---------------------------------------------------------------------------------------

class Builder:
    """Nodes and inline constants of one graph; weights come as ready TensorProtos."""

    def __init__(self, prefix: str):
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.prefix = prefix
        self.n = 0

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        self.n += 1
        name = out or f"{self.prefix}/{op_type}_{self.n}/output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=f"{self.prefix}/{op_type}_{self.n}",
                                           **attrs))
        return name

    def const(self, value: np.ndarray, name: str | None = None) -> str:
        from onnx import numpy_helper

        self.n += 1
        name = name or f"{self.prefix}/const_{self.n}"
        self.inits.append(numpy_helper.from_array(value, name))
        return name


class Weights:
    """Random weights appended to one external-data file; each tensor a TensorProto that points
    into it (the same protos serve the prefill and the decode graph: shared weights)."""

    def __init__(self, path: Path, rng: np.random.Generator):
        self.path = path
        self.f = open(path, "wb")  # noqa: SIM115 (closed by close())
        self.rng = rng

    def add(self, name: str, value: np.ndarray) -> Any:
        from onnx import TensorProto

        value = np.ascontiguousarray(value, dtype=np.float32)
        off = self.f.tell()
        self.f.write(value.tobytes())
        pad = (-self.f.tell()) % 64  # aligned, as onnx's own writer does for large tensors
        self.f.write(b"\0" * pad)
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(value.shape))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.path.name), ("offset", str(off)), ("length", str(value.nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, v
        return t

    def normal(self, name: str, shape: tuple[int, ...], scale: float) -> Any:
        return self.add(name, self.rng.standard_normal(shape, dtype=np.float32) * scale)

    def close(self) -> None:
        self.f.close()


def rope_tables(context: int, head: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inv = 1.0 / theta ** (np.arange(0, head, 2, dtype=np.float64) / head)
    ang = np.outer(np.arange(context, dtype=np.float64), inv)
    ang = np.concatenate([ang, ang], axis=1)
    rot = np.zeros((head, head), dtype=np.float32)  # x @ rot == rotate_half(x) = [-x2, x1]
    half = head // 2
    for i in range(half):
        rot[i + half, i] = -1.0
        rot[i, i + half] = 1.0
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32), rot


def part_graph(*, seq: int, layers: range, weights: dict[str, Any], cfg: dict[str, Any], names: dict[str, str],
               hidden_in: str, hidden_out: str, last: bool, graph_name: str) -> Any:
    """One part at sequence length ``seq`` (the window, or 1)."""
    from onnx import TensorProto, helper

    h, nh, kvh, hd, ctx = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head"], cfg["context"]
    b = Builder(f"/model/{graph_name}")
    cos, sin, rot = rope_tables(ctx, hd)
    # Positions of this chunk: past_seq_len - seq + 1 .. past_seq_len (genai's contract).
    end = b.op("Cast", b.op("Reshape", "past_seq_len", b.const(np.array([1, 1], np.int64))), to=TensorProto.FLOAT)
    pos = b.op("Add", end, b.const((np.arange(seq, dtype=np.float32) - (seq - 1)).reshape(seq, 1)))  # [S,1]
    cidx = b.const(np.arange(ctx, dtype=np.float32).reshape(1, ctx))
    onehot = b.op("Cast", b.op("Equal", pos, cidx), to=TensorProto.FLOAT)  # [S,C]
    onehot_t = b.op("Transpose", onehot, perm=[1, 0])  # [C,S]
    keep = b.op("Reshape", b.op("Sub", b.const(np.ones((1, ctx), np.float32)),
                                b.op("ReduceSum", onehot, b.const(np.array([0], np.int64)), keepdims=1)),
                b.const(np.array([1, 1, ctx, 1], np.int64)))
    total = b.op("Cast", "total_seq_len", to=TensorProto.FLOAT)  # [1]
    causal = b.op("Cast", b.op("LessOrEqual", cidx, pos), to=TensorProto.FLOAT)  # [S,C]
    in_total = b.op("Cast", b.op("Less", cidx, total), to=TensorProto.FLOAT)  # [1,C]
    allowed = b.op("Mul", causal, in_total)
    bias = b.op("Mul", b.op("Sub", allowed, b.const(np.array(1.0, np.float32))), b.const(np.array(1e4, np.float32)))
    cos_s = b.op("MatMul", onehot, b.const(cos))  # [S,hd]: the rotary angles at this chunk's positions
    sin_s = b.op("MatMul", onehot, b.const(sin))
    rot_c = b.const(rot)
    eps = b.const(np.array(1e-6, np.float32))
    scale = b.const(np.array(1.0 / np.sqrt(hd), np.float32))

    def rms(x: str, w: str) -> str:
        var = b.op("ReduceMean", b.op("Mul", x, x), axes=[-1], keepdims=1)
        return b.op("Mul", b.op("Div", x, b.op("Sqrt", b.op("Add", var, eps))), w)

    def heads(x: str, n: int) -> str:  # [1,S,n*hd] -> [1,n,S,hd]
        return b.op("Transpose", b.op("Reshape", x, b.const(np.array([1, seq, n, hd], np.int64))), perm=[0, 2, 1, 3])

    def rope(x: str) -> str:
        return b.op("Add", b.op("Mul", x, cos_s), b.op("Mul", b.op("MatMul", x, rot_c), sin_s))

    inputs = [helper.make_tensor_value_info(hidden_in, TensorProto.FLOAT, [1, seq, h])]
    outputs = []
    kv_shape = [1, kvh, ctx, hd]
    x = hidden_in
    for layer in layers:
        w = {k.split(".", 2)[2]: v.name for k, v in weights.items() if k.startswith(f"layers.{layer}.")}
        a = rms(x, w["input_norm"])
        q = rope(heads(b.op("MatMul", a, w["q"]), nh))
        k = rope(heads(b.op("MatMul", a, w["k"]), kvh))
        v = heads(b.op("MatMul", a, w["v"]), kvh)
        cache = {}
        for kind, new in (("key", k), ("value", v)):
            past, present = names[f"past_{kind}"] % layer, names[f"present_{kind}"] % layer
            inputs.append(helper.make_tensor_value_info(past, TensorProto.FLOAT, kv_shape))
            outputs.append(helper.make_tensor_value_info(present, TensorProto.FLOAT, kv_shape))
            cache[kind] = b.op("Add", b.op("Mul", past, keep), b.op("MatMul", onehot_t, new), out=present)
        kk, vv = cache["key"], cache["value"]
        if kvh != nh:  # grouped-query attention: each kv head serves nh/kvh query heads
            rep = b.const(np.array([1, nh // kvh, 1, 1], np.int64))
            kk = b.op("Reshape", b.op("Tile", b.op("Unsqueeze", kk, b.const(np.array([2], np.int64))),
                                      b.const(np.array([1, 1, nh // kvh, 1, 1], np.int64))),
                      b.const(np.array([1, nh, ctx, hd], np.int64)))
            vv = b.op("Reshape", b.op("Tile", b.op("Unsqueeze", vv, b.const(np.array([2], np.int64))),
                                      b.const(np.array([1, 1, nh // kvh, 1, 1], np.int64))),
                      b.const(np.array([1, nh, ctx, hd], np.int64)))
            del rep
        scores = b.op("Add", b.op("Mul", b.op("MatMul", q, b.op("Transpose", kk, perm=[0, 1, 3, 2])), scale), bias)
        o = b.op("MatMul", b.op("Softmax", scores, axis=-1), vv)  # [1,nh,S,hd]
        o = b.op("Reshape", b.op("Transpose", o, perm=[0, 2, 1, 3]), b.const(np.array([1, seq, nh * hd], np.int64)))
        x = b.op("Add", x, b.op("MatMul", o, w["o"]))
        m = rms(x, w["post_norm"])
        g = b.op("MatMul", m, w["gate"])
        act = b.op("Mul", b.op("Mul", g, b.op("Sigmoid", g)), b.op("MatMul", m, w["up"]))
        x = b.op("Add", x, b.op("MatMul", act, w["down"]))
    if last:
        x = rms(x, weights["norm"].name)
    b.nodes.append(helper.make_node("Identity", [x], [hidden_out], name=f"/model/{graph_name}/output"))
    inputs += [helper.make_tensor_value_info("past_seq_len", TensorProto.INT32, [1, 1]),
               helper.make_tensor_value_info("total_seq_len", TensorProto.INT32, [1])]
    outputs.insert(0, helper.make_tensor_value_info(hidden_out, TensorProto.FLOAT, [1, seq, h]))
    own = [t for k, t in weights.items() if k.startswith("layers.") and int(k.split(".")[1]) in layers]
    if last:
        own.append(weights["norm"])
    graph = helper.make_graph(b.nodes, graph_name, inputs, outputs, initializer=[*own, *b.inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ctxfarm-genai-export")
    model.ir_version = 8
    return model


def cpu_graph(kind: str, weight: Any, *, hidden: int, vocab: int) -> Any:
    from onnx import TensorProto, helper

    if kind == "embeddings":
        node = helper.make_node("Gather", [weight.name, "input_ids"], [EMBEDS], name="/model/embed_tokens/Gather")
        inp = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        out = helper.make_tensor_value_info(EMBEDS, TensorProto.FLOAT, ["batch_size", "sequence_length", hidden])
    else:
        node = helper.make_node("MatMul", [HIDDEN, weight.name], ["logits"], name="/lm_head/MatMul")
        inp = helper.make_tensor_value_info(HIDDEN, TensorProto.FLOAT, ["batch_size", "sequence_length", hidden])
        out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])
    graph = helper.make_graph([node], kind, [inp], [out], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ctxfarm-genai-export")
    model.ir_version = 8
    return model


def export(out: Path, *, parts: int = 2, hidden: int = 64, layers: int = 4, heads: int = 4, kv_heads: int | None = None,
           window: int = 64, context: int = 256, layout: str = "olive", seed: int = 0) -> dict[str, Any]:
    """Write the export folder; returns {"files": {name: size}, "config": ..., "prompt": ...}."""
    import onnx

    if layout not in ("olive", "aihub"):
        raise SystemExit(f"--layout is olive or aihub, not {layout!r}")
    kv_heads = kv_heads or heads
    if hidden % heads or heads % kv_heads or (hidden // heads) % 2:
        raise SystemExit("--hidden must be a multiple of 2 x heads, heads a multiple of kv heads")
    if not 1 <= parts <= layers:
        raise SystemExit("--parts must be between 1 and --layers")
    if context < window or window < 2:
        raise SystemExit("--context must be at least --window (>= 2)")
    out.mkdir(parents=True, exist_ok=True)
    hd = hidden // heads
    tok = write_tokenizer(out, context=context)
    vocab = tok["vocab"]
    cfg = {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head": hd, "context": context}
    rng = np.random.default_rng(seed)
    if layout == "olive":
        names = {"past_key": "past_key_values.%d.key", "past_value": "past_key_values.%d.value",
                 "present_key": "present.%d.key", "present_value": "present.%d.value"}
    else:
        names = {"past_key": "past_key_%d_in", "past_value": "past_value_%d_in",
                 "present_key": "past_key_%d_out", "present_value": "past_value_%d_out"}

    # CPU stages: each its own .onnx with its weights beside it in one data file.
    emb_w = Weights(out / "embeddings.onnx.data", rng)
    emb = cpu_graph("embeddings", emb_w.normal("model.embed_tokens.weight", (vocab, hidden), 1.0), hidden=hidden,
                    vocab=vocab)
    emb_w.close()
    onnx.save_model(emb, str(out / "embeddings.onnx"))
    lm_w = Weights(out / "lm_head.onnx.data", rng)
    lm = cpu_graph("lm_head", lm_w.normal("lm_head.weight", (hidden, vocab), 4.0 / np.sqrt(hidden)), hidden=hidden,
                   vocab=vocab)
    lm_w.close()
    onnx.save_model(lm, str(out / "lm_head.onnx"))

    per = -(-layers // parts)
    spans = [range(i * per, min(layers, (i + 1) * per)) for i in range(parts)]
    if any(len(s) == 0 for s in spans):
        raise SystemExit(f"{layers} layers do not split into {parts} non-empty parts")
    stages: dict[str, Any] = {"embeddings": {"filename": "embeddings.onnx", "inputs": ["input_ids"],
                                             "outputs": [EMBEDS]}}
    qnn = {"session_options": {"log_id": "onnxruntime-genai", "intra_op_num_threads": 1,
                               "provider_options": [{"qnn": {"htp_performance_mode": "burst",
                                                             "htp_graph_finalization_optimization_mode": "3",
                                                             "soc_model": "60"}}]}}
    iters: dict[str, Any] = {}
    hidden_in = EMBEDS
    for i, span in enumerate(spans):
        last = i == parts - 1
        hidden_out = HIDDEN if last else f"/model/layers.{span[-1]}/Add_1/output_0"
        if layout == "olive":
            data_name = f"context_{i}.onnx.data" if parts > 1 else "context.onnx.data"
            suffix = f"_{i}" if parts > 1 else ""
            files = {"prefill": (f"context{suffix}", f"context{suffix}.onnx"),
                     "decode": (f"iterator{suffix}", f"iterator{suffix}.onnx")}
        else:
            data_name = f"model_part_{i + 1}_of_{parts}.data"
            files = {"prefill": (f"prompt_{i + 1}_of_{parts}", f"prompt_ar{window}_cl{context}_{i + 1}_of_{parts}.onnx"),
                     "decode": (f"token_{i + 1}_of_{parts}", f"token_ar1_cl{context}_{i + 1}_of_{parts}.onnx")}
        w = Weights(out / data_name, rng)
        weights: dict[str, Any] = {}
        for layer in span:
            p = f"layers.{layer}."
            weights[p + "input_norm"] = w.add(f"model.layers.{layer}.input_layernorm.weight", np.ones(hidden, np.float32))
            for key, shape in (("q", (hidden, hidden)), ("k", (hidden, kv_heads * hd)), ("v", (hidden, kv_heads * hd)),
                               ("o", (hidden, hidden)), ("gate", (hidden, 2 * hidden)), ("up", (hidden, 2 * hidden)),
                               ("down", (2 * hidden, hidden))):
                weights[p + key] = w.normal(f"model.layers.{layer}.{key}_proj.weight", shape, 0.5 / np.sqrt(shape[0]))
            weights[p + "post_norm"] = w.add(f"model.layers.{layer}.post_attention_layernorm.weight",
                                             np.ones(hidden, np.float32))
        if last:
            weights["norm"] = w.add("model.norm.weight", np.ones(hidden, np.float32))
        w.close()
        for kind, seq in (("prefill", window), ("decode", 1)):
            stage, file = files[kind]
            model = part_graph(seq=seq, layers=span, weights=weights, cfg=cfg, names=names, hidden_in=hidden_in,
                               hidden_out=hidden_out, last=last, graph_name=stage)
            onnx.save_model(model, str(out / file))
            onnx.checker.check_model(str(out / file))
            entry = {"filename": file, "inputs": [v.name for v in model.graph.input],
                     "outputs": [v.name for v in model.graph.output], **qnn,
                     ("run_on_token_gen" if kind == "prefill" else "run_on_prompt"): False}
            (stages if kind == "prefill" else iters)[stage] = entry
        hidden_in = hidden_out
    stages.update(iters)  # Olive's order: embeddings, context_*, iterator_*, lm_head
    stages["lm_head"] = {"filename": "lm_head.onnx", "inputs": [HIDDEN], "outputs": ["logits"],
                         "is_lm_head": True}
    config = {
        "model": {
            "bos_token_id": tok["bos"], "eos_token_id": tok["eos"], "pad_token_id": tok["pad"],
            "context_length": context, "vocab_size": vocab, "type": "decoder-pipeline",
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "head_size": hd, "hidden_size": hidden, "num_attention_heads": heads,
                "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
                "inputs": {"input_ids": "input_ids", "past_key_names": names["past_key"],
                           "past_value_names": names["past_value"],
                           "past_sequence_length": "past_seq_len", "total_sequence_length": "total_seq_len"},
                "outputs": {"logits": "logits", "present_key_names": names["present_key"],
                            "present_value_names": names["present_value"]},
                "sliding_window": {"window_size": window, "pad_value": tok["pad"], "alignment": "left",
                                   "slide_key_value_cache": False},
                "pipeline": [stages],
            },
        },
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
                   "max_length": context, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 1, "top_p": 1.0},
    }
    (out / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    files_written = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {"layout": layout, "files": files_written, "prompt": PROMPT, "vocab": vocab}


OLIVE_SCRIPT = r"""
import json, shutil, subprocess, sys
from pathlib import Path
import torch, transformers
a = json.loads(sys.argv[1])
hf = Path(a["work"]) / "hf"
cfg = transformers.Qwen2Config(vocab_size=a["vocab"], hidden_size=a["hidden"], intermediate_size=2 * a["hidden"],
                               num_hidden_layers=a["layers"], num_attention_heads=a["heads"],
                               num_key_value_heads=a["kv_heads"], max_position_embeddings=a["context"],
                               bos_token_id=a["bos"], eos_token_id=a["eos"], pad_token_id=a["pad"],
                               tie_word_embeddings=False)
torch.manual_seed(a["seed"])
transformers.Qwen2ForCausalLM(cfg).save_pretrained(hf)
transformers.GenerationConfig(do_sample=False, bos_token_id=a["bos"], eos_token_id=a["eos"],
                              pad_token_id=a["pad"]).save_pretrained(hf)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy2(Path(a["work"]) / "tok" / f, hf / f)
run = {
    "input_model": {"type": "HfModel", "model_path": str(hf)},
    "systems": {"local": {"type": "LocalSystem",
                          "accelerators": [{"device": "npu", "execution_providers": ["QNNExecutionProvider"]}]}},
    "passes": {
        "cs": {"type": "CaptureSplitInfo", "num_splits": a["parts"], "unique_embeds_lm_head_splits": True},
        "mb": {"type": "ModelBuilder", "precision": "fp32"},
        "gs": {"type": "GraphSurgeries", "surgeries": [{"surgeon": "RemoveRopeMultiCache"},
                                                         {"surgeon": "AttentionMaskToSequenceLengths"},
                                                         {"surgeon": "SimplifiedLayerNormToL2Norm"}]},
        "sp": {"type": "SplitModel"},
        "st": {"type": "StaticLLM", "batch_size": 1, "context_length": a["window"]},
    },
    "host": "local", "target": "local", "log_severity_level": 3, "no_artifacts": True,
    "output_dir": a["out"], "cache_dir": str(Path(a["work"]) / "cache"),
}
(Path(a["work"]) / "olive.json").write_text(json.dumps(run, indent=1))
from olive.workflows import run as olive_run
olive_run(str(Path(a["work"]) / "olive.json"))
"""


def export_olive(out: Path, *, python: str, parts: int = 2, hidden: int = 64, layers: int = 4, heads: int = 4,
                 kv_heads: int | None = None, window: int = 64, context: int = 256, seed: int = 0) -> dict[str, Any]:
    """The export written by Olive itself (``--exporter olive``), in the environment of ``python``."""
    import os
    import subprocess
    import tempfile

    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty (Olive writes into an empty folder)")
    with tempfile.TemporaryDirectory(prefix="genai-olive-") as work:
        (Path(work) / "tok").mkdir()
        tok = write_tokenizer(Path(work) / "tok", context=context)
        args = {"work": work, "out": str(out.resolve()), "vocab": tok["vocab"], "bos": tok["bos"], "eos": tok["eos"],
                "pad": tok["pad"], "hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads or heads,
                "context": context, "window": window, "parts": parts, "seed": seed}
        env = {**os.environ, "OLIVE_DISABLE_TELEMETRY": "1"}
        env.pop("PYTHONPATH", None)  # Olive's own environment, not this project's
        exe = os.path.abspath(python) if os.sep in python else python  # it runs from the work folder
        proc = subprocess.run([exe, "-c", OLIVE_SCRIPT, json.dumps(args)], capture_output=True, text=True, env=env,
                              cwd=work, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"Olive failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {"layout": "olive", "exporter": "olive", "files": files, "prompt": PROMPT, "vocab": tok["vocab"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the export folder to write")
    ap.add_argument("--parts", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="fewer than --heads: grouped-query attention")
    ap.add_argument("--window", type=int, default=64, help="the prefill length (Olive's recipe: 64)")
    ap.add_argument("--context", type=int, default=256, help="the KV-cache length (search.max_length)")
    ap.add_argument("--layout", choices=("olive", "aihub"), default="olive")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exporter", choices=("helper", "olive"), default="helper",
                    help="olive: run Olive's static passes (needs --python, see above)")
    ap.add_argument("--python", help="--exporter olive: the interpreter of an environment with torch, "
                                     "transformers, olive-ai 0.13 and onnxruntime-genai 0.11")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.exporter == "olive":
        if not a.python or a.layout != "olive":
            raise SystemExit("--exporter olive needs --python and writes the olive layout")
        res = export_olive(a.out, python=a.python, parts=a.parts, hidden=a.hidden, layers=a.layers, heads=a.heads,
                           kv_heads=a.kv_heads, window=a.window, context=a.context, seed=a.seed)
    else:
        res = export(a.out, parts=a.parts, hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                     window=a.window, context=a.context, layout=a.layout, seed=a.seed)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for name, size in res["files"].items():
            print(f"{size:>14,}  {name}")
        print(f"{sum(res['files'].values()):>14,}  total ({res['layout']} layout) in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
