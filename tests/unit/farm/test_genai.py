"""farm.core.genai: an LLM export folder read into a description (Olive's and AI Hub's layouts),
the generated genai_config.json, and hostile folders refused as ``bad-genai`` naming the file."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from farm.core import genai
from farm.core.errors import BadGenaiError, GenaiFolderError
from tests.common.genai import edit_config, make_export


@pytest.fixture(scope="module")
def olive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_export(tmp_path_factory.mktemp("olive") / "export")


@pytest.fixture(scope="module")
def aihub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_export(tmp_path_factory.mktemp("aihub") / "export", "--layout", "aihub")


@pytest.fixture
def copy(olive: Path, tmp_path: Path) -> Path:
    out = tmp_path / "export"
    shutil.copytree(olive, out)
    return out


def _stages(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["model"]["decoder"]["pipeline"][0]


# ---- reading what exporters leave -----------------------------------------------------------------

def test_an_olive_export_is_described(olive: Path) -> None:
    e = genai.read_export(olive)
    assert e.layout == "olive"
    assert [s.name for s in e.stages] == ["embeddings", "context_0", "context_1", "iterator_0", "iterator_1", "lm_head"]
    assert [(p.index, p.prefill.graph.file, p.decode.graph.file, p.data, p.layers) for p in e.parts] == [
        (0, "context_0.onnx", "iterator_0.onnx", ("context_0.onnx.data",), (0,)),
        (1, "context_1.onnx", "iterator_1.onnx", ("context_1.onnx.data",), (1,))]
    assert e.kv == genai.KvCache("past_key_values.%d.key", "past_key_values.%d.value", "present.%d.key",
                                 "present.%d.value", layers=2, window=16, length=64, kv_heads=4, head_size=16)
    assert [s.kind for s in e.cpu] == ["embeddings", "lm_head"]
    assert e.carried_files() == ["embeddings.onnx", "embeddings.onnx.data", "lm_head.onnx", "lm_head.onnx.data",
                                 "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    assert genai.roles(e) == {"embeddings": "embeddings", "context_0": "part0.prefill", "context_1": "part1.prefill",
                              "iterator_0": "part0.decode", "iterator_1": "part1.decode", "lm_head": "lm_head"}
    assert e.group_members(1) == [("prefill", str(olive.resolve() / "context_1.onnx")),
                                  ("decode", str(olive.resolve() / "iterator_1.onnx"))]


OLIVE_REAL = Path(__file__).resolve().parents[2] / "data" / "genai" / "olive-qwen2-tiny"


def test_what_olive_itself_wrote_is_described() -> None:
    """tests/data/genai/olive-qwen2-tiny: Olive 0.13's static passes on a random Qwen2
    (bench/genai_export.py --exporter olive): its KV length is symbolic, sized by context_length;
    each part's graphs share context_<i>.onnx.data; the residual stream crosses parts as two
    tensors; its config has nulls genai would refuse."""
    e = genai.read_export(OLIVE_REAL)
    assert e.layout == "olive"
    assert [(p.prefill.graph.file, p.decode.graph.file, p.data, p.layers) for p in e.parts] == [
        ("context_0.onnx", "iterator_0.onnx", ("context_0.onnx.data",), (0,)),
        ("context_1.onnx", "iterator_1.onnx", ("context_1.onnx.data",), (1,))]
    assert (e.kv.window, e.kv.length, e.kv.kv_heads, e.kv.head_size, e.kv.layers) == (16, 64, 2, 16, 2)
    assert e.parts[0].prefill.graph.shape("past_key_values.0.key") == (1, 2, "past_sequence_length", 16)
    assert len(e.parts[1].prefill.graph.inputs) == 6  # two hidden-state tensors, KV, past_seq_len, total_seq_len
    assert e.carried_files() == ["embeddings.onnx", "lm_head.onnx", "tokenizer.json", "tokenizer_config.json",
                                 "generation_config.json"]
    assert e.config["search"]["temperature"] is None
    doc = genai.genai_config(e, genai.package_layout(e))
    assert "temperature" not in doc["search"] and doc["model"]["eos_token_id"] == 320
    assert doc["search"]["max_length"] == 64 and doc["model"]["context_length"] == 64


def test_an_aihub_export_is_described(aihub: Path) -> None:
    e = genai.read_export(aihub)
    assert e.layout == "aihub" and e.window == 16 and e.kv.past_key == "past_key_%d_in"
    assert [(p.prefill.graph.file, p.decode.graph.file, p.data) for p in e.parts] == [
        ("prompt_ar16_cl64_1_of_2.onnx", "token_ar1_cl64_1_of_2.onnx", ("model_part_1_of_2.data",)),
        ("prompt_ar16_cl64_2_of_2.onnx", "token_ar1_cl64_2_of_2.onnx", ("model_part_2_of_2.data",))]
    assert genai.roles(e)["token_2_of_2"] == "part1.decode"


def test_an_aihub_name_that_lies_about_its_graph_is_refused(aihub: Path, tmp_path: Path) -> None:
    d = tmp_path / "export"
    shutil.copytree(aihub, d)
    (d / "token_ar1_cl64_2_of_2.onnx").rename(d / "token_ar1_cl128_2_of_2.onnx")
    edit_config(d, lambda doc: _stages(doc)["token_2_of_2"].update(filename="token_ar1_cl128_2_of_2.onnx"))
    with pytest.raises(BadGenaiError, match="its name says ar1 cl128, its graph is ar1 cl64"):
        genai.read_export(d)


def test_a_single_part_olive_export(tmp_path: Path) -> None:
    e = genai.read_export(make_export(tmp_path / "one", "--parts", "1"))
    assert [(p.prefill.graph.file, p.decode.graph.file, p.data) for p in e.parts] == [
        ("context.onnx", "iterator.onnx", ("context.onnx.data",))]
    assert genai.roles(e)["iterator"] == "part0.decode"


# ---- the folder that ships ------------------------------------------------------------------------

def test_the_generated_config_points_at_the_package_files(olive: Path) -> None:
    e = genai.read_export(olive)
    layout = genai.package_layout(e)
    assert layout == {"embeddings": "embeddings.onnx", "context_0": "context_0_ctx.onnx",
                      "context_1": "context_1_ctx.onnx", "iterator_0": "iterator_0_ctx.onnx",
                      "iterator_1": "iterator_1_ctx.onnx", "lm_head": "lm_head.onnx"}
    assert [genai.part_binary(e, 0), genai.part_binary(e, 1, 2)] == ["context_0_ctx_qnn.bin", "context_1_ctx_qnn_2.bin"]
    doc = genai.genai_config(e, layout)
    dec = doc["model"]["decoder"]
    assert doc["model"]["type"] == "decoder-pipeline" and "filename" not in dec
    assert dec["session_options"]["provider_options"] == []  # the KV cache stays on the CPU
    assert dec["sliding_window"] == {"window_size": 16, "pad_value": doc["model"]["pad_token_id"],
                                     "alignment": "left", "slide_key_value_cache": False}
    assert dec["inputs"]["past_sequence_length"] == "past_seq_len"
    assert dec["inputs"]["total_sequence_length"] == "total_seq_len"
    assert dec["outputs"]["present_key_names"] == "present.%d.key" and dec["num_hidden_layers"] == 2
    assert doc["search"]["max_length"] == 64 and doc["search"]["past_present_share_buffer"] is True
    stages = _stages(doc)
    assert list(stages) == [s.name for s in e.stages]
    assert {n: s["filename"] for n, s in stages.items()} == layout
    for name in ("context_0", "iterator_1"):  # the recipe's runtime option kept, its soc_model not
        assert stages[name]["session_options"] == {"provider_options": [{"qnn": {
            "backend_type": "htp", "htp_performance_mode": "burst"}}]}
    assert (stages["context_0"]["run_on_prompt"], stages["context_0"]["run_on_token_gen"]) == (True, False)
    assert (stages["iterator_0"]["run_on_prompt"], stages["iterator_0"]["run_on_token_gen"]) == (False, True)
    assert "session_options" not in stages["embeddings"] and stages["lm_head"]["is_lm_head"] is True
    # Written in that order: genai runs the stages in the object's key order.
    written = json.loads(genai.config_bytes(doc))
    assert list(_stages(written)) == list(stages)
    # On the CPU (the twin's reference): no provider for any stage.
    cpu = genai.genai_config(e, layout, provider_options=[], max_length=1000)
    assert _stages(cpu)["context_1"]["session_options"] == {"provider_options": []}
    assert cpu["search"]["max_length"] == 64  # capped at the KV length


@pytest.mark.parametrize("files,needle", [
    ({"context_0": "../context_0.onnx"}, "is not allowed"),
    ({"context_0": "/etc/passwd"}, "is not allowed"),
    ({"context_0": "sub/dir/x.onnx"}, "is not allowed"),
    ({"context_0": None}, "has no file"),
])
def test_the_config_refuses_unsafe_or_missing_file_names(olive: Path, files: dict[str, Any], needle: str) -> None:
    e = genai.read_export(olive)
    layout = {**genai.package_layout(e), **files}
    if files.get("context_0", "") is None:
        del layout["context_0"]
    with pytest.raises(BadGenaiError) as info:
        genai.genai_config(e, layout)
    assert needle in info.value.message


# ---- hostile export folders -----------------------------------------------------------------------

def _rm(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


def _cfg(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    return lambda d: edit_config(d, change)


def _stage(name: str, **kv: Any) -> Callable[[Path], None]:
    return _cfg(lambda doc: _stages(doc)[name].update(kv))


def _drop(name: str) -> Callable[[Path], None]:
    return _cfg(lambda doc: _stages(doc).pop(name))


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes(data)


def _escape_data(d: Path) -> None:
    """iterator_0.onnx's weights point outside the folder."""
    m = onnx.load(str(d / "iterator_0.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../outside.data"
    onnx.save_model(m, str(d / "iterator_0.onnx"))


def _symlink_out(d: Path) -> None:
    (d.parent / "secret.onnx").write_bytes((d / "lm_head.onnx").read_bytes())
    (d / "lm_head.onnx").unlink()
    os.symlink(d.parent / "secret.onnx", d / "lm_head.onnx")


def _rename_part(d: Path) -> None:
    (d / "context_1.onnx").rename(d / "context_2.onnx")
    (d / "iterator_1.onnx").rename(d / "iterator_2.onnx")
    edit_config(d, lambda doc: (_stages(doc)["context_1"].update(filename="context_2.onnx"),
                                _stages(doc)["iterator_1"].update(filename="iterator_2.onnx")))


def _swap_window(d: Path) -> None:
    """part 1's prefill made from a 32-token window: prefill lengths differ between parts."""
    m = onnx.load(str(d / "context_1.onnx"), load_external_data=False)
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 32
    onnx.save_model(m, str(d / "context_1.onnx"))


def _rename_io(d: Path) -> None:
    m = onnx.load(str(d / "iterator_0.onnx"), load_external_data=False)
    m.graph.output[0].name = "renamed"
    m.graph.node[-1].output[0] = "renamed"
    onnx.save_model(m, str(d / "iterator_0.onnx"))
    edit_config(d, lambda doc: _stages(doc)["iterator_0"].update(outputs=[o.name for o in m.graph.output]))


def _overlap_layers(d: Path) -> None:
    """part 1's graphs renamed to hold layer 0's KV as well."""
    for f in ("context_1.onnx", "iterator_1.onnx"):
        m = onnx.load(str(d / f), load_external_data=False)
        ren = {f"past_key_values.1.{k}": f"past_key_values.0.{k}" for k in ("key", "value")}
        ren.update({f"present.1.{k}": f"present.0.{k}" for k in ("key", "value")})
        for v in (*m.graph.input, *m.graph.output):
            v.name = ren.get(v.name, v.name)
        for n in m.graph.node:
            n.input[:] = [ren.get(x, x) for x in n.input]
            n.output[:] = [ren.get(x, x) for x in n.output]
        onnx.save_model(m, str(d / f))
        stage = f.split(".")[0]
        edit_config(d, lambda doc, m=m, stage=stage: _stages(doc)[stage].update(
            inputs=[v.name for v in m.graph.input], outputs=[v.name for v in m.graph.output]))


def _compiled(d: Path) -> None:
    """context_0.onnx replaced by a compiled model (an EPContext node)."""
    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", embed_mode=0,
                            ep_cache_context="context_0_qnn.bin", source="QNNExecutionProvider")
    g = helper.make_graph([node], "ctx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save_model(helper.make_model(g), str(d / "context_0.onnx"))
    edit_config(d, lambda doc: _stages(doc)["context_0"].update(inputs=["x"], outputs=["y"]))


def _mixed(d: Path) -> None:
    shutil.copy2(d / "context_1.onnx", d / "prompt_ar16_cl64_2_of_2.onnx")
    edit_config(d, lambda doc: _stages(doc)["context_1"].update(filename="prompt_ar16_cl64_2_of_2.onnx"))


def _many_entries(d: Path) -> None:
    for i in range(genai.MAX_ENTRIES + 1):
        (d / f"junk{i}").touch()


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "no config": (_rm("genai_config.json"), "genai_config.json is missing"),
    "config not JSON": (_write("genai_config.json", b"{not json"), "genai_config.json is not valid JSON"),
    "config not UTF-8": (_write("genai_config.json", b"\xff\xfe{}"), "genai_config.json is not valid JSON"),
    "config a list": (_write("genai_config.json", b"[1, 2]"), "no model.decoder object"),
    "huge config": (_write("genai_config.json", b" " * (genai.MAX_CONFIG_BYTES + 1) + b"{}"), "over the"),
    "deep config": (_write("genai_config.json", b"[" * 100000 + b"]" * 100000), "not valid JSON"),
    "config a folder": (lambda d: ((d / "genai_config.json").unlink(), (d / "genai_config.json").mkdir()),
                        "not a regular file"),
    "not a pipeline": (_cfg(lambda doc: doc["model"].update(type="decoder")), "not 'decoder-pipeline'"),
    "no stages": (_cfg(lambda doc: doc["model"]["decoder"].update(pipeline=[])), "pipeline must be a list"),
    "stage name odd": (_cfg(lambda doc: _stages(doc).update({"../x\n": _stages(doc).pop("lm_head")})),
                       "is not a stage name"),
    "stage name long": (_cfg(lambda doc: _stages(doc).update({"s" * 65: _stages(doc).pop("lm_head")})),
                        "is not a stage name"),
    "stage not an object": (_cfg(lambda doc: _stages(doc).update(context_0=3)), "is not an object"),
    "name escapes": (_stage("lm_head", filename="../lm_head.onnx"), 'lm_head.filename: "../lm_head.onnx" is not a plain'),
    "absolute name": (_stage("lm_head", filename="/etc/passwd"), 'lm_head.filename: "/etc/passwd" is not a plain'),
    "subfolder name": (_stage("lm_head", filename="sub/lm_head.onnx"), "is not a plain file name"),
    "name not a string": (_stage("lm_head", filename=["x"]), "lm_head.filename: [\"x\"] is not a string"),
    "hidden file": (_stage("lm_head", filename=".lm_head.onnx"), "is not a plain file name"),
    "symlink out": (_symlink_out, "leaves its directory"),
    "missing stage file": (_rm("iterator_1.onnx"), "iterator_1.onnx is missing"),
    "stage not ONNX": (_write("lm_head.onnx", b"\x08\x07garbage" * 10), "lm_head.onnx: not an ONNX model"),
    "empty stage": (_write("lm_head.onnx", b""), "lm_head.onnx: not an ONNX model"),
    "missing weights": (_rm("context_1.onnx.data"), "context_1.onnx.data is missing"),
    "weights escape": (_escape_data, "iterator_0.onnx: external data"),
    "file used twice": (_stage("iterator_0", filename="context_0.onnx"), "used by two stages"),
    "config I/O differs": (_stage("lm_head", inputs=["nope"]), "are not lm_head.onnx's graph inputs"),
    "unknown layout": (_cfg(lambda doc: [_stages(doc).pop(k) for k in list(_stages(doc)) if k[:4] in ("cont", "iter")]),
                       "unknown layout"),
    "mixed layouts": (_mixed, "mix Olive's and AI Hub's"),
    "part without decode": (_drop("iterator_1"), "part 1 has no decode graph"),
    "parts with a gap": (_rename_part, "numbered [0, 2]"),
    "prefill and decode differ": (_rename_io, "iterator_0.onnx: its inputs/outputs differ"),
    "overlapping layers": (_overlap_layers, "KV layer 0 is also in part 0"),
    "windows differ": (_swap_window, "prefill lengths differ"),
    "already compiled": (_compiled, "already compiled"),
    "no lm_head": (_drop("lm_head"), "no lm_head stage"),
    "no tokenizer": (_rm("tokenizer.json"), "tokenizer.json is missing"),
    "too many entries": (_many_entries, "more than 4096 entries"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_export_is_refused_naming_the_file(copy: Path, case: str) -> None:
    breakage, needle = HOSTILE[case]
    breakage(copy)
    with pytest.raises(BadGenaiError) as info:
        genai.read_export(copy)
    err = info.value
    assert err.code == "bad-genai" and err.exit_code == 2
    assert needle in err.message, err.message
    assert len(err.message) < 1000


def test_a_stored_package_laid_out_without_weights_reads_the_same(olive: Path, copy: Path) -> None:
    """The assembly lays a stored package out without its parts' weights (it reads none): the
    export reads the same, external data named; read with its weights, the same folder is refused."""
    for data in copy.glob("*.onnx.data"):
        data.unlink()
    light = genai.read_export(copy, weights=False)
    full = genai.read_export(olive)
    assert [p.prefill.graph.data for p in light.parts] == [p.prefill.graph.data for p in full.parts]
    assert light.parts[0].data and light.config == full.config
    with pytest.raises(BadGenaiError, match="is missing"):
        genai.read_export(copy)
    # A hostile name is refused all the same: only the file's presence is not looked for.
    _escape_data(copy)
    with pytest.raises(BadGenaiError):
        genai.read_export(copy, weights=False)


def test_not_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    for p, why in ((tmp_path / "missing", "no such folder"), (tmp_path / "f", "not a folder")):
        with pytest.raises(BadGenaiError, match=why):
            genai.read_export(p)


# ---- a built folder, read back without a runtime --------------------------------------------------

def _ctx_model(path: Path, node_name: str, bin_name: str) -> None:
    """A context model of two partitions (the EP split it around a CPU op): the main node names
    the binary, the second (main_context 0) names none, as the QNN EP writes them."""
    node = helper.make_node("EPContext", ["x"], ["h"], name=node_name, domain="com.microsoft", embed_mode=0,
                            ep_cache_context=bin_name, main_context=1, source="QNNExecutionProvider")
    second = helper.make_node("EPContext", ["h"], ["y"], name=f"{node_name}_b", domain="com.microsoft", embed_mode=0,
                              main_context=0, source="QNNExecutionProvider")
    g = helper.make_graph([node, second], "ctx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(helper.make_model(g), str(path))


def _built(root: Path, olive: Path) -> Path:
    """A folder shaped like a package (fake contexts: no runtime reads them here)."""
    e = genai.read_export(olive)
    layout = genai.package_layout(e)
    for p in e.parts:
        for stage in (p.prefill, p.decode):
            _ctx_model(root / layout[stage.name], f"{stage.kind}_{p.index}", genai.part_binary(e, p.index))
        (root / genai.part_binary(e, p.index)).write_bytes(np.zeros(16, np.uint8).tobytes())
    for f in e.carried_files():
        shutil.copy2(e.path(f), root / f)
    (root / genai.CONFIG_FILE).write_bytes(genai.config_bytes(genai.genai_config(e, layout)))
    return root


def test_a_built_folder_is_read_back(olive: Path, tmp_path: Path) -> None:
    config, stages = genai.inspect_folder(_built(tmp_path / "pkg", olive))
    assert [(s.name, s.file, s.binaries, s.contexts) for s in stages if s.binaries] == [
        ("context_0", "context_0_ctx.onnx", ("context_0_ctx_qnn.bin",), ("prefill_0", "prefill_0_b")),
        ("context_1", "context_1_ctx.onnx", ("context_1_ctx_qnn.bin",), ("prefill_1", "prefill_1_b")),
        ("iterator_0", "iterator_0_ctx.onnx", ("context_0_ctx_qnn.bin",), ("decode_0", "decode_0_b")),
        ("iterator_1", "iterator_1_ctx.onnx", ("context_1_ctx_qnn.bin",), ("decode_1", "decode_1_b"))]
    shared = genai.shared_binaries(stages)
    assert {b: [s.name for s in users] for b, users in shared.items()} == {
        "context_0_ctx_qnn.bin": ["context_0", "iterator_0"], "context_1_ctx_qnn.bin": ["context_1", "iterator_1"]}
    assert [s.file for s in stages if not s.binaries] == ["embeddings.onnx", "lm_head.onnx"]


def test_a_binary_held_elsewhere_need_not_be_in_the_folder_but_its_name_is_checked(olive: Path,
                                                                                    tmp_path: Path) -> None:
    """``inspect_folder(elsewhere=...)``: the farm's folder check does not fetch a binary its part
    build already read; its name is still checked as every EPContext path is, and a binary not
    named there must still be in the folder."""
    root = _built(tmp_path / "pkg", olive)
    (root / "context_1_ctx_qnn.bin").unlink()
    _, stages = genai.inspect_folder(root, elsewhere={"context_1_ctx_qnn.bin"})
    assert {b for s in stages for b in s.binaries} == {"context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin"}
    (root / "context_0_ctx_qnn.bin").unlink()
    with pytest.raises(GenaiFolderError, match="context_0_ctx_qnn.bin is missing"):
        genai.inspect_folder(root, elsewhere={"context_1_ctx_qnn.bin"})
    _ctx_model(root / "iterator_1_ctx.onnx", "decode_1", "../outside.bin")
    with pytest.raises(GenaiFolderError, match="is not allowed"):
        genai.inspect_folder(root, elsewhere={"context_0_ctx_qnn.bin", "context_1_ctx_qnn.bin", "../outside.bin"})


@pytest.mark.parametrize("case,needle", [
    ("missing bin", "context_1_ctx_qnn.bin is missing"),
    ("bin escapes", "'../outside.bin' is not allowed"),
    ("missing stage", "iterator_0_ctx.onnx is missing"),
    ("sub folder", "\"sub/context_0_ctx.onnx\" is not a plain file name"),
    ("no config", "genai_config.json is missing"),
    ("no tokenizer", "tokenizer.json is missing"),
])
def test_a_broken_built_folder_is_genai_folder_invalid(olive: Path, tmp_path: Path, case: str, needle: str) -> None:
    root = _built(tmp_path / "pkg", olive)
    if case == "missing bin":
        (root / "context_1_ctx_qnn.bin").unlink()
    elif case == "bin escapes":
        _ctx_model(root / "iterator_1_ctx.onnx", "decode_1", "../outside.bin")
    elif case == "missing stage":
        (root / "iterator_0_ctx.onnx").unlink()
    elif case == "no tokenizer":
        (root / "tokenizer.json").unlink()
    elif case == "sub folder":
        edit_config(root, lambda d: _stages(d)["context_0"].update(filename="sub/context_0_ctx.onnx"))
    else:
        (root / genai.CONFIG_FILE).unlink()
    with pytest.raises(GenaiFolderError) as info:
        genai.inspect_folder(root)
    assert info.value.code == "genai-folder-invalid" and needle in info.value.message, info.value.message
