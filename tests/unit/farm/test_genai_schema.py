"""An export is checked completely before anything compiles: every key of genai_config.json the
farm or onnxruntime-genai reads (``farm.core.genai_schema``), attacked with values of the wrong
JSON type or out of range, for each layout, is refused by the real folder check
(``read_export``) as ``bad-genai`` naming the file and the key's JSON path; NaN/Infinity
literals and repeated keys too; the tokenizer's JSON files and the graphs' shapes likewise."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from farm.core import genai, genai_schema, jsonspec
from farm.core.errors import BadGenaiError
from tests.common.genai import make_export
from tests.common.hostile_genai import linked_copy, put, spec_cases, write_config

# Keys read_config checks for shape before the spec (their own messages name them so).
STRUCTURAL = {("model",): "model.decoder", ("model", "decoder"): "model.decoder", ("model", "type"): "model.type",
              ("model", "decoder", "pipeline"): "model.decoder.pipeline",
              ("model", "decoder", "pipeline", 0): "model.decoder.pipeline", (): "model.decoder"}


@pytest.fixture(scope="module", params=["olive", "aihub"])
def export(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "export"
    return make_export(out, *(("--layout", "aihub") if request.param == "aihub" else ()))


def _refusal(folder: Path) -> BadGenaiError | None:
    try:
        genai.read_export(folder)
    except BadGenaiError as exc:
        return exc
    return None


def test_every_key_of_the_spec_with_a_bad_value_is_refused_naming_it(export: Path, tmp_path: Path) -> None:
    doc = json.loads((export / genai.CONFIG_FILE).read_text())
    cases = list(spec_cases(genai_schema.GENAI_CONFIG))
    assert len(cases) > 500  # every key, nested ones included
    wrong: list[str] = []
    for i, (path, value) in enumerate(cases):
        d = copy.deepcopy(doc) if path else value
        if path:
            put(d, path, value)
        folder = linked_copy(export, tmp_path / f"c{i}")
        write_config(folder, d)
        err = _refusal(folder)
        named = [n for n in (STRUCTURAL.get(path), jsonspec.json_path(path) or "(the document)") if n]
        if (err is None or err.code != "bad-genai" or genai.CONFIG_FILE not in err.message
                or not any(n in err.message for n in named)):
            wrong.append(f"{jsonspec.json_path(path)} = {jsonspec.shown(value)}: {err.message if err else 'accepted'}")
    assert not wrong, "\n".join(wrong[:40])


@pytest.mark.parametrize("value", ['"64"', "[64]", "NaN", "Infinity", "-Infinity", "-64", "0", "true", "64.5",
                                   "1e400", "99999999999999999999"])
def test_context_length_of_a_fixed_kv_cache(export: Path, tmp_path: Path, value: str) -> None:
    """The example that was found: the KV length fixed in the graphs, the config's context_length
    unused for sizing, yet carried into the generated config (int() on it after the compile)."""
    raw = (export / genai.CONFIG_FILE).read_text()
    folder = linked_copy(export, tmp_path / "e")
    (folder / genai.CONFIG_FILE).write_text(raw.replace('"context_length": 64', f'"context_length": {value}', 1))
    err = _refusal(folder)
    assert err is not None and "genai_config.json: model.context_length: " in err.message, err
    assert err.exit_code == 2 and err.hint


@pytest.mark.parametrize("text,named", [
    ('"model": {"x_unknown": NaN, ', "model.x_unknown: NaN is not a JSON number"),
    ('"model": {"x_unknown": [1, -Infinity], ', "model.x_unknown[1]: -Infinity is not a JSON number"),
    ('"model": {"type": "decoder", ', 'the key "type" is given twice'),
])
def test_literals_json_has_not_and_repeated_keys(export: Path, tmp_path: Path, text: str, named: str) -> None:
    raw = (export / genai.CONFIG_FILE).read_text()
    folder = linked_copy(export, tmp_path / "e")
    (folder / genai.CONFIG_FILE).write_text(raw.replace('"model": {', text, 1))
    err = _refusal(folder)
    assert err is not None and named in err.message, err


def test_a_well_formed_config_keeps_its_values(export: Path) -> None:
    """What the spec accepts, the generated config carries (nulls left out, lengths capped)."""
    e = genai.read_export(export)
    doc = genai.genai_config(e, genai.package_layout(e))
    assert doc["model"]["context_length"] == e.kv.length and doc["search"]["max_length"] == e.kv.length


@pytest.mark.parametrize("name,data,named", [
    ("tokenizer.json", b"{not json", "tokenizer.json is not valid JSON"),
    ("tokenizer.json", b"[1, 2]", "tokenizer.json: (the document): [1, 2] is not an object"),
    ("tokenizer.json", b'{"version": "1.0"}', "tokenizer.json: model: is missing"),
    ("tokenizer.json", b'{"model": {"unk": NaN}}', "tokenizer.json: model.unk: NaN is not a JSON number"),
    ("tokenizer_config.json", b'"a string"', "tokenizer_config.json: (the document)"),
    ("special_tokens_map.json", b"\xff\xfe", "special_tokens_map.json is not valid JSON"),
])
def test_the_tokenizer_json_files(export: Path, tmp_path: Path, name: str, data: bytes, named: str) -> None:
    folder = linked_copy(export, tmp_path / "e")
    (folder / name).unlink()
    (folder / name).write_bytes(data)
    err = _refusal(folder)
    assert err is not None and named in err.message, err


def _dims(folder: Path, files: list[str], change: Any) -> None:
    for f in files:
        (folder / f).unlink()  # a hard link: write a file of its own
        m = onnx.load(str(folder.parent / "src" / f), load_external_data=False)
        change(m)
        onnx.save_model(m, str(folder / f))


@pytest.mark.parametrize("what,needle", [("head_size", "head size (1 to 4096)"), ("kv_heads", "heads (1 to 1024)"),
                                         ("window", "has no static sequence length"),
                                         ("name", "graph outputs[0]: \"present\\nkey\" is not a string")])
def test_graph_shapes_out_of_range(export: Path, tmp_path: Path, what: str, needle: str) -> None:
    """The shapes the farm reads from the graphs are bounded like the config's values."""
    e = genai.read_export(export)
    p0 = e.parts[0]
    src = linked_copy(export, tmp_path / "src")
    folder = linked_copy(src, tmp_path / "e")
    pk = e.kv.past_key % min(p0.layers)

    def change(m: onnx.ModelProto) -> None:
        for v in (*m.graph.input, *m.graph.output):
            dims = v.type.tensor_type.shape.dim
            if what == "head_size" and v.name == pk:
                dims[3].dim_value = 1 << 20
            elif what == "kv_heads" and v.name == pk:
                dims[1].dim_value = 1 << 20
            elif what == "window" and v.name == p0.prefill.graph.inputs[0][0] and len(dims) > 1:
                dims[1].dim_value = 1 << 30
        if what == "name":  # a graph output renamed to hold a control character
            old = m.graph.output[0].name
            m.graph.output[0].name = "present\nkey"
            for n in m.graph.node:
                n.output[:] = ["present\nkey" if o == old else o for o in n.output]

    _dims(folder, [p0.prefill.graph.file] + ([p0.decode.graph.file] if what != "window" else []), change)
    err = _refusal(folder)
    assert err is not None and needle in err.message and p0.prefill.graph.file in err.message, err
