"""Graph groups and multi-SoC builds, for real: QNN 2.51.0 compiles (onnxruntime-qnn) in the
embedded farm, the QNN System API's description of the binaries, resolve and fetch as a device."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from farm.core.settings import Settings
from tests.common.cli import farm
from tests.common.groups import prefill_decode
from tests.common.onnx_models import save
from tests.common.registry_state import snapshot
from tests.common.schemas import valid


def _show(env: dict[str, str], artifact: str) -> dict:  # type: ignore[type-arg]
    return json.loads(farm(env, "show", artifact, "--json").stdout)


def test_group_builds_one_shared_binary_described_and_delivered_whole(
        settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    prefill, decode = prefill_decode(tmp_path / "m", external=True)
    out = json.loads(farm(farm_env, "build", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}",
                          "-t", "qnn:SM8650", "--name", "llm/tiny", "--tag", "t1", "--json").stdout)
    assert out["ok"] and out["graphs"] == ["prefill", "decode"]
    valid("build", out)
    (b,) = out["builds"]
    assert b["state"] == "built" and b["nodes_ep"] == 2 and b["nodes_cpu"] == 0

    info = _show(farm_env, b["artifact"])
    files = {f["name"]: f["role"] for f in info["files"]}
    # Fixed stems: g<i>_ctx.onnx per graph, the one .bin named by the EP after the first graph.
    assert {n for n, r in files.items() if r == "ctx-model"} == {"g0_ctx.onnx", "g1_ctx.onnx"}
    assert [n for n, r in files.items() if r == "context"] == ["g0_ctx_qnn.bin"]
    graphs = info["manifest"]["graphs"]
    assert [(g["name"], g["ctxModel"], g["contexts"]) for g in graphs] == [
        ("prefill", "g0_ctx.onnx", ["g0_ctx_qnn.bin"]), ("decode", "g1_ctx.onnx", ["g0_ctx_qnn.bin"])]
    # The binary's own description (QNN System API of QNN 2.51.0): exactly these two graphs,
    # with the source models' inputs and outputs; weight-shared: unverified, never "loads".
    desc = info["description"]
    assert desc["check"].startswith("ok") and desc["soc_models"] == [57]
    assert desc["binaries"]["g0_ctx_qnn.bin"]["build_id"].startswith("v2.51.0")
    by_name = {g["name"]: g for g in desc["graphs"]}
    assert {t["name"]: t["shape"] for t in by_name["prefill"]["inputs"]} == {"x": [1, 16, 64], "bias": [1, 16, 64]}
    assert {t["name"]: t["shape"] for t in by_name["decode"]["inputs"]} == {"x": [1, 1, 64], "bias": [1, 1, 64]}
    assert by_name["decode"]["outputs"] == [{"name": "y", "shape": [1, 1, 64], "dtype": "float32"}]
    assert "weight-shared" in desc["unverified"] and info["verdicts"] == []
    text = farm(farm_env, "show", b["artifact"]).stdout
    assert "verdict   unverified: the x86_64 simulator cannot load weight-shared contexts" in text
    assert "graph decode" in text and "x float32[1,1,64]" in text
    # Coverage says the cell can't be verified here, and why: JSON and the table.
    cov = json.loads(farm(farm_env, "coverage", "--json").stdout)
    valid("coverage", cov)
    (cell,) = [c for c in cov["cells"] if c["model"] == out["model"]]
    assert cell["state"] == "built" and "weight-shared graph group" in cell["unverified"]
    assert "built unverified" in farm(farm_env, "coverage").stdout

    # The same graphs elsewhere, and through a group file, are the same group: cached.
    other = tmp_path / "copy"
    shutil.copytree(tmp_path / "m", other)
    group_file = other / "group.toml"
    group_file.write_text('[[graphs]]\nname = "prefill"\npath = "prefill/prefill.onnx"\n'
                          '[[graphs]]\nname = "decode"\npath = "decode/decode.onnx"\n')
    again = json.loads(farm(farm_env, "build", "--group-file", str(group_file), "-t", "qnn:SM8650", "--json").stdout)
    assert again["model"] == out["model"] and again["builds"][0]["state"] == "cached"
    assert again["builds"][0]["artifact"] == b["artifact"]
    # Another order is another group.
    swapped = json.loads(farm(farm_env, "build", "--graph", f"decode={decode}", "--graph", f"prefill={prefill}",
                              "-t", "qnn:SM8650", "--json").stdout)
    assert swapped["model"] != out["model"]

    # A device gets the whole group, atomically, under the manifest's names.
    res = json.loads(farm(farm_env, "resolve", "--model", "llm/tiny:t1", "--soc", "SM8650", "--qnn", "2.51.0",
                          "--json").stdout)
    assert res["artifact"] == b["artifact"] and "weight-shared" in res["unverified"]
    assert res["verdict"] == "unverified"  # served by the rule, never claimed to load
    valid("resolve", res)
    dev = tmp_path / "device"
    farm(farm_env, "fetch", "--model", "llm/tiny:t1", "--soc", "SM8650", "--qnn", "2.51.0", "--out", str(dev))
    assert sorted(p.name for p in dev.iterdir()) == ["g0_ctx.onnx", "g0_ctx_qnn.bin", "g1_ctx.onnx"]
    partitions = []
    for ctx in ("g0_ctx.onnx", "g1_ctx.onnx"):
        node = onnx.load(str(dev / ctx)).graph.node[0]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["ep_cache_context"] == b"g0_ctx_qnn.bin" and attrs["main_context"] == 1
        partitions.append(attrs["partition_name"].decode())
    # Each graph's own context model, naming its own graph in the binary (a merge once published
    # the last graph's context model under every graph's name: decode would have run prefill).
    assert partitions == [g["qnn_graphs"][0] for g in desc["graphs"]] and len(set(partitions)) == 2, (partitions, desc)
    # load-check on this machine says why it can't tell, instead of blaming the file.
    # Its own outcome and exit status, not runtime-crashed, and checked before any load.
    checked = farm(farm_env, "load-check", str(dev / "g1_ctx.onnx"), "-t", "qnn:SM8650", check=False)
    assert checked.returncode == 4 and "Traceback" not in checked.stderr
    assert "error[load-unverified]" in checked.stderr and "runtime-crashed" not in checked.stderr
    assert "simulator cannot load weight-shared contexts" in checked.stderr and "no verdict on the device" in checked.stderr
    # The folder itself: both graphs checked, one outcome.
    folder = farm(farm_env, "load-check", str(dev), "-t", "qnn:SM8650", "--json", check=False)
    assert folder.returncode == 4, folder.stderr
    err = json.loads(folder.stdout)["error"]
    assert err["code"] == "load-unverified" and "graph group" in err["message"]
    assert [c["file"] for c in err["details"]["contexts"]] == ["g0_ctx.onnx", "g1_ctx.onnx"]


def test_group_refusals_write_nothing(settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    prefill, decode = prefill_decode(tmp_path)
    junk = tmp_path / "notes.onnx"
    junk.write_text("not a model")
    farm(farm_env, "build", str(prefill), "-t", "qnn:SM8650")  # an index to compare against
    before = snapshot(settings)
    cases = [
        (["--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8450"],
         2, "sharing-unsupported", "HTP v69"),
        (["--graph", f"prefill={prefill}", "--graph", f"prefill={decode}", "-t", "qnn:SM8650"],
         2, "bad-group", "given twice"),
        (["--graph", f"Pre/../fill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650"],
         2, "bad-group", "not allowed"),
        (["--graph", f"prefill={prefill}", "-t", "qnn:SM8650"], 2, "bad-group", "at least two"),
        (["--graph", f"prefill={junk}", "--graph", f"decode={decode}", "-t", "qnn:SM8650"],
         1, "invalid-model", "graph 'prefill'"),
        (["--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650+SM8750"],
         2, "sharing-unsupported", "multi-SoC"),
        (["--graph", "prefill", "--graph", f"decode={decode}", "-t", "qnn:SM8650"], 2, "bad-group", "NAME=PATH"),
        ([str(prefill), "--graph", f"decode={decode}", "-t", "qnn:SM8650"], 2, "usage", "not both"),
        (["--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650", "--min-psnr", "30"],
         1, "accuracy-unverified", "weight-shared"),
    ]
    for args, rc, code, words in cases:
        proc = farm(farm_env, "build", *args, check=False)
        assert proc.returncode == rc, (args, proc.stderr)
        assert f"error[{code}]" in proc.stderr and words in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert snapshot(settings) == before


def test_multi_soc_build_serves_each_soc_and_a_per_soc_build_wins(
        settings: Settings, farm_env: dict[str, str], tmp_path: Path) -> None:
    from tests.common.groups import shared_graph

    model = str(save(shared_graph(16), tmp_path / "m.onnx"))
    out = json.loads(farm(farm_env, "build", model, "-t", "qnn:SM8750+SM8650", "--name", "ms", "--json").stdout)
    (b,) = out["builds"]
    assert b["state"] == "built" and b["target"] == "qnn:SM8650+SM8750"  # canonical: catalog order
    info = _show(farm_env, b["artifact"])
    desc = info["description"]
    # A ZIP container of one HTP cache per SoC, each described by the System API.
    (binary,) = desc["binaries"].values()
    assert binary["container"] == "multi-soc" and binary["soc_models"] == [57, 69]
    assert desc["check"].startswith("ok") and "multi-SoC" in desc["unverified"] and info["verdicts"] == []
    for soc in ("SM8650", "SM8750"):
        res = json.loads(farm(farm_env, "resolve", "--model", "ms", "--soc", soc, "--qnn", "2.51.0",
                              "--json").stdout)
        assert res["artifact"] == b["artifact"] and "multi-SoC build" in res["reason"] and res["unverified"]
    miss = farm(farm_env, "resolve", "--model", "ms", "--soc", "SM8550", "--qnn", "2.51.0", check=False)
    assert miss.returncode == 3 and "error[no-match]" in miss.stderr
    # A per-SoC build of the same model comes first for its SoC (compiled for it, verifiable here).
    one = json.loads(farm(farm_env, "build", model, "-t", "qnn:SM8650", "--name", "ms", "--json").stdout)
    res = json.loads(farm(farm_env, "resolve", "--model", "ms", "--soc", "SM8650", "--qnn", "2.51.0",
                          "--json").stdout)
    assert res["artifact"] == one["builds"][0]["artifact"]
    res = json.loads(farm(farm_env, "resolve", "--model", "ms", "--soc", "SM8750", "--qnn", "2.51.0",
                          "--json").stdout)
    assert res["artifact"] == b["artifact"]


def test_single_model_artifact_carries_its_description(settings: Settings, farm_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    from tests.common.groups import shared_graph

    model = str(save(shared_graph(4), tmp_path / "m.onnx"))
    out = json.loads(farm(farm_env, "build", model, "-t", "qnn:SM8750", "--json").stdout)
    info = _show(farm_env, out["builds"][0]["artifact"])
    desc = info["description"]
    assert desc["check"].startswith("ok") and desc["soc_models"] == [69] and "unverified" not in desc
    (g,) = desc["graphs"]
    assert sorted(t["name"] for t in g["inputs"]) == ["bias", "x"] and g["outputs"][0]["shape"] == [1, 4, 64]
    assert [v["verdict"] for v in info["verdicts"]] == ["loads"]  # the self-probe, as before


@pytest.mark.parametrize("sdk", ["2.47.0"])
def test_multi_soc_refused_below_qnn_2_48(sdk: str) -> None:
    from farm.core.catalog import parse_target
    from farm.core.errors import MultiSocUnsupportedError
    from farm.core.groups import check_build_support

    with pytest.raises(MultiSocUnsupportedError, match="QNN >= 2.48"):
        check_build_support(parse_target("qnn:SM8650+SM8750"), sdk, group=False)
    check_build_support(parse_target("qnn:SM8650+SM8750"), "2.49.40", group=False)


def test_parts_get_binaries_of_their_own(farm_env: dict[str, str], tmp_path: Path) -> None:
    p1, d1 = prefill_decode(tmp_path / "p1", seed=1)
    p2, d2 = prefill_decode(tmp_path / "p2", seed=2)
    out = json.loads(farm(farm_env, "build", "--graph", f"part1.prefill={p1}", "--graph", f"part1.decode={d1}",
                          "--graph", f"part2.prefill={p2}", "--graph", f"part2.decode={d2}", "-t", "qnn:SM8750",
                          "--json").stdout)
    info = _show(farm_env, out["builds"][0]["artifact"])
    assert [(g["name"], g["contexts"]) for g in info["manifest"]["graphs"]] == [
        ("part1.prefill", ["g0_ctx_qnn.bin"]), ("part1.decode", ["g0_ctx_qnn.bin"]),
        ("part2.prefill", ["g2_ctx_qnn.bin"]), ("part2.decode", ["g2_ctx_qnn.bin"])]
    assert info["description"]["check"].startswith("ok")
    assert sorted(info["description"]["binaries"]) == ["g0_ctx_qnn.bin", "g2_ctx_qnn.bin"]


def test_an_unchanged_group_is_recognised_without_reading_its_weights(
        settings: Settings, farm_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.pipeline.groups import load_group

    prefill, decode = prefill_decode(tmp_path / "m", external=True)
    members = [("prefill", str(prefill)), ("decode", str(decode))]
    out = json.loads(farm(farm_env, "build", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}",
                          "-t", "qnn:SM8650", "--json").stdout)

    def no_reading(*_a: object) -> None:
        raise AssertionError("a remembered file was read again")

    with monkeypatch.context() as m:
        m.setattr("farm.core.digests.sha256_file", no_reading)
        m.setattr("farm.core.groups.inspect_model", no_reading)
        again = load_group(settings, members)
    assert again.digest == out["model"]
    assert [e["digest"] for e, _ in again.sources()] == [f["digest"] for f in again.files_json()]
    # Other weights of the same size: the stat changed, the files are read, another group.
    data = prefill.parent / "weights.data"
    data.write_bytes(bytes(reversed(data.read_bytes())))
    assert load_group(settings, members).digest != out["model"]
