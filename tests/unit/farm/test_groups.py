"""Graph groups without a compile: names, group files, digests, and the sharing/multi-SoC rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.core.catalog import parse_target
from farm.core.errors import BadGroupError, InvalidModelError, MultiSocUnsupportedError, SharingUnsupportedError
from farm.core.groups import (
    GROUP_FILE,
    check_build_support,
    inspect_group,
    parse_graph_args,
    read_descriptor,
    read_group_file,
)
from tests.common.groups import prefill_decode


@pytest.mark.parametrize("name", ["prefill", "decode", "part1.prefill", "p_4.decode", "a" * 32])
def test_good_graph_names(name: str) -> None:
    assert parse_graph_args([f"{name}=x.onnx"]) == [(name, "x.onnx")]


@pytest.mark.parametrize("name", ["", "Prefill", "../x", "a/b", "1st", "a..b", "x" * 33, "pre fill", "g\x00",
                                  "décode", "a.b.c.d.e"])
def test_bad_graph_names(name: str) -> None:
    with pytest.raises(BadGroupError):
        parse_graph_args([f"{name}=x.onnx"])


def test_group_digest_covers_names_order_and_content(tmp_path: Path) -> None:
    p, d = prefill_decode(tmp_path / "a", external=True)
    g = inspect_group([("prefill", str(p)), ("decode", str(d))])
    assert inspect_group([("prefill", str(p)), ("decode", str(d))]).digest == g.digest
    assert inspect_group([("decode", str(d)), ("prefill", str(p))]).digest != g.digest
    assert inspect_group([("prefill", str(p)), ("token", str(d))]).digest != g.digest
    p2, d2 = prefill_decode(tmp_path / "b", external=True, seed=1)
    assert inspect_group([("prefill", str(p2)), ("decode", str(d2))]).digest != g.digest
    # The snapshot: group.json first, each member under a fixed directory, never its name.
    paths = [f["path"] for f in g.files_json()]
    assert paths == [GROUP_FILE, "g0/g0.onnx", "g0/weights.data", "g1/g1.onnx", "g1/weights.data"]
    doc = json.loads(g.descriptor)
    assert [x["name"] for x in doc["graphs"]] == ["prefill", "decode"]
    assert read_descriptor(g.path)["graphs"] == doc["graphs"]
    assert [e["digest"] for e, _ in g.sources()] == [f["digest"] for f in g.files_json()]


def test_descriptor_from_a_tampered_snapshot_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / GROUP_FILE
    bad.write_text(json.dumps({"kind": "ctxfarm.graph-group.v1", "graphs": [
        {"name": "prefill", "model": "x", "file": "../../etc/passwd"},
        {"name": "decode", "model": "y", "file": "g1/g1.onnx"}]}))
    with pytest.raises(InvalidModelError):
        read_descriptor(bad)
    bad.write_text(json.dumps({"kind": "ctxfarm.graph-group.v1", "graphs": [
        {"name": "x/../y", "file": "g0/g0.onnx"}, {"name": "decode", "file": "g1/g1.onnx"}]}))
    with pytest.raises(BadGroupError):
        read_descriptor(bad)


def test_group_files(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps({"graphs": [{"name": "prefill", "path": "a.onnx"},
                                                            {"name": "decode", "path": "/abs/b.onnx"}]}))
    assert read_group_file(tmp_path / "g.json") == [("prefill", str(tmp_path / "a.onnx")), ("decode", "/abs/b.onnx")]
    (tmp_path / "g.toml").write_text('[[graphs]]\nname = "prefill"\npath = "a.onnx"\n')
    assert read_group_file(tmp_path / "g.toml") == [("prefill", str(tmp_path / "a.onnx"))]
    for text in ("{", '{"graphs": 3}', '{"graphs": [{"name": "x"}]}', '[]'):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(BadGroupError):
            read_group_file(tmp_path / "bad.json")
    with pytest.raises(BadGroupError):
        read_group_file(tmp_path / "missing.json")


def test_member_data_may_not_take_the_members_onnx_name(tmp_path: Path) -> None:
    import onnx

    from tests.common.groups import shared_graph

    (tmp_path / "p").mkdir()
    onnx.save_model(shared_graph(16), str(tmp_path / "p" / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="g0.onnx", size_threshold=0)
    _, d = prefill_decode(tmp_path)
    with pytest.raises(InvalidModelError, match="g0.onnx"):
        inspect_group([("prefill", str(tmp_path / "p" / "m.onnx")), ("decode", str(d))])


def test_multi_soc_targets_are_canonical() -> None:
    t = parse_target("qnn:sm8750+snapdragon-8-gen-3")
    assert t.name == "SM8650+SM8750" and t.socs == ("SM8650", "SM8750") and t.soc_models == (57, 69)
    assert t.multi_soc and t.covers == ("SM8650", "SM8750") and t.soc_model is None
    assert parse_target("qnn:SM8650+SM8650") == parse_target("qnn:SM8650")
    from farm.core.errors import UnknownTargetError

    for ref in ("qnn:SM8650+", "qnn:SM8650+SM9999", "qnn:+SM8650"):
        with pytest.raises(UnknownTargetError):
            parse_target(ref)


def test_sharing_and_multi_soc_rules() -> None:
    v75, v69, v73 = parse_target("qnn:SM8650"), parse_target("qnn:SM8450"), parse_target("qnn:SM8550")
    check_build_support(v75, "2.47.0", group=True)
    check_build_support(v73, "2.47.0", group=True)
    with pytest.raises(SharingUnsupportedError, match="v69"):
        check_build_support(v69, "2.51.0", group=True)
    check_build_support(v69, "2.51.0", group=False)
    multi = parse_target("qnn:SM8650+SM8750")
    with pytest.raises(MultiSocUnsupportedError):
        check_build_support(multi, "2.47.0", group=False)
    check_build_support(multi, "2.48.0", group=False)
    with pytest.raises(SharingUnsupportedError, match="multi-SoC"):
        check_build_support(multi, "2.51.0", group=True)
    with pytest.raises(SharingUnsupportedError, match="QNN only"):
        check_build_support(parse_target("trt:sm_90"), "10.14.1.48", group=True)


@pytest.mark.parametrize("suffix,text", [
    (".json", '{"graphs": ' + "[" * 50_000 + "]" * 50_000 + "}"),
    (".toml", "graphs = " + "[" * 50_000 + "]" * 50_000),
])
def test_a_deeply_nested_group_file_is_bad_group_not_a_recursion_error(tmp_path: Path, suffix: str,
                                                                       text: str) -> None:
    """A deeply nested group file once crashed the CLI (exit 70, RecursionError)."""
    from farm.core.errors import BadGroupError
    from farm.core.groups import read_group_file

    path = tmp_path / f"g{suffix}"
    path.write_text(text)
    with pytest.raises(BadGroupError, match="nests"):
        read_group_file(path)


def test_brackets_inside_names_and_paths_do_not_count_as_nesting(tmp_path: Path) -> None:
    from farm.core.groups import _depth

    assert _depth('{"graphs": [{"name": "a[[[[", "path": "p{{{{.onnx"}]}') == 3
    assert _depth("[[graphs]]\nname = 'x[[[['\npath = \"p\\\"[[[\"\n") == 2


def test_an_llm_refused_for_a_soc_without_sharing_is_not_told_about_graph() -> None:
    """`farm build --genai` for SM8350 (HTP v68): the refusal speaks of the LLM's parts; the
    --graph the user never gave (and building graph by graph) only for a graph group."""
    for ref in ("qnn:SM8350", "trt:sm_89"):
        with pytest.raises(SharingUnsupportedError) as llm:
            check_build_support(parse_target(ref), "2.51.0", group=True, llm=True)
        assert "LLM" in llm.value.message and "--graph" not in f"{llm.value.message} {llm.value.hint}"
    with pytest.raises(SharingUnsupportedError) as group:
        check_build_support(parse_target("qnn:SM8350"), "2.51.0", group=True)
    assert "--graph" in group.value.hint
