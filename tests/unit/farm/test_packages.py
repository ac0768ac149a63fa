"""farm.core.packages: the ORT model package layout made from published builds (data only), its
content addresses, what changes a package's inputs, and the record a device checks."""

from __future__ import annotations

import hashlib

import pytest

from farm.core import packages as pk
from farm.core.errors import InvalidModelError, ManifestError, NoPublishedBuildsError, PackageAmbiguousError
from farm.core.names import UnsafePathError

MODEL = "sha256:" + "a" * 64
SOC_ID = {"SM8650": "57", "SM8750": "69", "SM8650+SM8750": "57,69"}
# ep_compatibility_info.QNNExecutionProvider of a MatMul compiled for SM8650 and SM8750 (measured;
# docs/packages.md): QNN 2.47.0's is one string for both SoCs, 2.49.40's and 2.51.0's name the SoC.
QNN_247 = "6:2.47.0:5.47.0:0.0.0:68:0"


def qnn_compat(target: str, toolchain: str) -> str:
    return QNN_247 if toolchain == "2.47.0" else f"v2:6:{toolchain}:5.51.0:0:{SOC_ID[target]}:0:0"


def d(c: str) -> str:
    return "sha256:" + c * 64


def build(target: str, toolchain: str = "2.51.0", backend: str = "qnn", *, art: str = "1", options: str = "0",
          graphs: tuple[dict, ...] | None = None, files: tuple[pk.PackageFile, ...] | None = None) -> pk.Build:
    files = files or (pk.PackageFile("model_ctx.onnx", d(art), 10), pk.PackageFile("model_ctx_qnn.bin", d("f"), 99))
    return pk.Build(d(art), backend, target, toolchain, d(options), files[0].path, files, graphs,
                    qnn_compat(target, toolchain) if backend == "qnn" else None,
                    {"soc_model": SOC_ID[target]} if backend == "qnn" else {}, ("Gemm",) if target == "SM8750" else ())


SINGLE = [{"path": "model.onnx", "digest": d("b"), "size": 5}, {"path": "weights.bin", "digest": d("c"), "size": 7}]


def test_single_model_two_qnn_builds_a_trt_build_and_the_cpu_variant_last():
    layout = pk.plan(package_name="mynet", package_version="stable", model=MODEL, model_files=SINGLE, group=None,
                     builds=[build("SM8750", art="2"), build("SM8650", art="1"),
                             build("sm_89", "10.14.1", "trt", art="3")])
    [comp] = layout.components
    assert comp.name == "model" and comp.directory == "c0"
    names = [v.name for v in comp.variants]
    assert names == ["qnn-SM8650-2.51.0", "qnn-SM8750-2.51.0", "trt-sm_89-10.14.1", "cpu"]
    qnn, qnn2, trt, cpu = comp.variants
    assert (qnn.ep, qnn.device, qnn.compatibility_string) == ("QNNExecutionProvider", "npu", "v2:6:2.51.0:5.51.0:0:57:0:0")
    assert qnn.provider_options == {"soc_model": "57"} and qnn.model_file == "model_ctx.onnx"
    assert qnn2.metadata["cpu_op_types"] == ["Gemm"]  # partial offload named in the variant's metadata
    assert (trt.ep, trt.device, trt.compatibility_string) == ("TensorrtExecutionProvider", "gpu", None)
    assert (cpu.ep, cpu.device, cpu.model_file) == ("CPUExecutionProvider", "cpu", "model.onnx")
    # The weights are a shared asset the CPU variant points ONNX Runtime at.
    [asset] = layout.assets.values()
    assert cpu.session_options == {pk.EXTERNAL_DATA_FOLDER: asset.uri}
    assert asset.directory == "shared_assets/sha256-" + asset.uri[7:]
    paths = [f["path"] for f in layout.files()]
    assert paths == sorted(paths) and len(paths) == len(set(paths))
    assert "c0/cpu/model.onnx" in paths and f"{asset.directory}/weights.bin" in paths
    assert {v.directory for v in comp.variants} == {"c0/v0", "c0/v1", "c0/v2", "c0/cpu"}
    body = qnn.body()
    assert body["variant_directory"] == "c0/v0" and body["additional_metadata"]["ctxfarm"]["target"] == "qnn:SM8650"


def test_two_socs_of_one_sdk_with_one_compatibility_string_are_refused_when_nothing_else_is_left():
    # QNN 2.47.0 writes the same string for SM8650 and SM8750: ORT would score both variants
    # alike (soc_model takes no part) and pick by declaration order.
    builds = [build("SM8650", "2.47.0", art="1"), build("SM8750", "2.47.0", art="2")]
    assert builds[0].compatibility == builds[1].compatibility
    with pytest.raises(PackageAmbiguousError) as e:
        pk.plan(package_name="m", package_version="t", model=MODEL, model_files=SINGLE[:1], group=None, builds=builds)
    assert e.value.code == "package-ambiguous-variants" and "SM8650" in e.value.message and "SM8750" in e.value.message
    assert "--soc" in e.value.hint


def test_beside_builds_that_name_their_soc_the_tied_ones_are_left_out_and_said():
    tied = [build("SM8650", "2.47.0", art="1"), build("SM8750", "2.47.0", art="2")]
    layout = pk.plan(package_name="m", package_version="t", model=MODEL, model_files=SINGLE[:1], group=None,
                     builds=[*tied, build("SM8650", art="3"), build("SM8750", art="4")])
    held = {v.metadata.get("artifact") for v in layout.components[0].variants} - {None}
    assert held == {d("3"), d("4")} and layout.artifacts == sorted([d("3"), d("4")])
    assert [(o["target"], o["toolchain"]) for o in layout.left_out] == [("qnn:SM8650", "2.47.0"),
                                                                         ("qnn:SM8750", "2.47.0")]
    assert all("can't tell these variants apart" in o["why"] for o in layout.left_out)
    rec = pk.record(layout, inputs="x", files=[], evidence={}, ref="m:t")
    assert rec["left_out"] == layout.left_out


def test_equal_strings_for_different_targets_are_refused_whatever_the_sdk():
    same = [pk.Build(d(a), "qnn", t, "2.51.0", d("0"), "model_ctx.onnx", (), None, "v2:6:2.51.0:5.51.0:0:57:0:0",
                     {"soc_model": "57,69" if "+" in t else "57"}) for a, t in (("1", "SM8650"), ("2", "SM8650+SM8750"))]
    with pytest.raises(PackageAmbiguousError):
        pk.distinguishable(same)


def test_a_string_that_does_not_name_the_soc_is_left_out_never_rewritten():
    layout = pk.plan(package_name="m", package_version="t", model=MODEL, model_files=SINGLE[:1], group=None,
                     builds=[build("SM8650", "2.47.0", art="1"), build("SM8650", "2.51.0", art="2"),
                             build("SM8750", "2.49.40", art="3")])
    old, new, other, _ = layout.components[0].variants
    assert old.metadata["toolchain"] == "2.47.0"
    assert old.compatibility_string is None and "compatibility_string" not in old.body()
    assert old.metadata["ep_compatibility_not_naming_soc"] == QNN_247  # kept as evidence
    assert old.provider_options == {"soc_model": "57"}
    assert new.compatibility_string == "v2:6:2.51.0:5.51.0:0:57:0:0"
    assert other.compatibility_string == "v2:6:2.49.40:5.51.0:0:69:0:0"
    # A string naming another SoC than the build's is not the build's SoC either.
    assert not pk.identifies_soc("v2:6:2.51.0:5.51.0:0:69:0:0", "57")
    assert pk.identifies_soc("v2:6:2.51.0:5.51.0:0:57:0:0", "57") and not pk.identifies_soc(None, "57")
    assert not pk.identifies_soc(QNN_247, "57")


def test_no_published_build_is_refused_with_its_code():
    with pytest.raises(NoPublishedBuildsError) as e:
        pk.plan(package_name="m", package_version="t", model=MODEL, model_files=SINGLE, group=None, builds=[])
    assert e.value.code == "no-published-builds" and e.value.exit_code == 3 and "farm build" in e.value.hint


def test_two_builds_of_one_target_and_toolchain_get_distinct_names():
    layout = pk.plan(package_name="m", package_version="t", model=MODEL, model_files=SINGLE[:1], group=None,
                     builds=[build("SM8650", art="1", options="1"), build("SM8650", art="2", options="2")])
    names = [v.name for v in layout.components[0].variants]
    assert len(set(names)) == 3 and names[1].startswith("qnn-SM8650-2.51.0-")
    assert layout.assets == {}  # no external data: no asset, no folder option
    assert layout.components[0].cpu.session_options == {}


def test_group_shares_weights_and_the_build_once():
    group = {"graphs": [{"name": "prefill"}, {"name": "decode"}]}
    files = [{"path": "group.json", "digest": d("9"), "size": 1},
             {"path": "g0/g0.onnx", "digest": d("b"), "size": 5}, {"path": "g0/w.bin", "digest": d("c"), "size": 7},
             {"path": "g1/g1.onnx", "digest": d("e"), "size": 5}, {"path": "g1/w.bin", "digest": d("c"), "size": 7}]
    gfiles = (pk.PackageFile("g0_ctx.onnx", d("1"), 3), pk.PackageFile("g0_ctx_qnn.bin", d("f"), 99),
              pk.PackageFile("g1_ctx.onnx", d("2"), 3))
    graphs = ({"name": "prefill", "ctxModel": "g0_ctx.onnx"}, {"name": "decode", "ctxModel": "g1_ctx.onnx"})
    layout = pk.plan(package_name="llm", package_version="q4", model=MODEL, model_files=files, group=group,
                     builds=[build("SM8650", art="1", graphs=graphs, files=gfiles)])
    assert [c.name for c in layout.components] == ["prefill", "decode"]
    # Two assets: the shared weights (both graphs' CPU variants) and the group build (both graphs' QNN variants).
    assert len(layout.assets) == 2
    weights = pk.asset_uri([pk.PackageFile("w.bin", d("c"), 7)])
    assert all(c.cpu.session_options[pk.EXTERNAL_DATA_FOLDER] == weights for c in layout.components)
    q0, q1 = (c.variants[0] for c in layout.components)
    build_uri = q0.model_file.split("/")[0]
    assert q0.model_file == f"{build_uri}/g0_ctx.onnx" and q1.model_file == f"{build_uri}/g1_ctx.onnx"
    assert q0.files == () and q1.files == ()  # their folders are empty: the files live in the asset
    assert q0.session_options == {pk.SHARE_EP_CONTEXTS: "1"}  # the graphs share their binaries
    bins = [f for f in layout.files() if f["path"].endswith("g0_ctx_qnn.bin")]
    assert len(bins) == 1  # the shared binary is stored once
    assert sum(f["path"].endswith("/w.bin") for f in layout.files()) == 1
    assert set(layout.directories()) == {"c0/cpu", "c0/v0", "c1/cpu", "c1/v0"}


def test_group_build_without_the_graph_is_refused():
    group = {"graphs": [{"name": "prefill"}, {"name": "decode"}]}
    files = [{"path": "group.json", "digest": d("9"), "size": 1}, {"path": "g0/g0.onnx", "digest": d("b"), "size": 5},
             {"path": "g1/g1.onnx", "digest": d("e"), "size": 5}]
    with pytest.raises(InvalidModelError):
        pk.plan(package_name="llm", package_version="q4", model=MODEL, model_files=files, group=group,
                builds=[build("SM8650", graphs=({"name": "prefill", "ctxModel": "g0_ctx.onnx"},))])


@pytest.mark.parametrize("bad", ["../evil.bin", "/etc/passwd", "a/../../b", "a\\b", "", "./x/../../y"])
def test_hostile_file_names_from_the_index_never_become_paths(bad):
    files = [{"path": "model.onnx", "digest": d("b"), "size": 5}, {"path": bad, "digest": d("c"), "size": 7}]
    with pytest.raises(UnsafePathError):
        pk.plan(package_name="m", package_version="t", model=MODEL, model_files=files, group=None,
                builds=[build("SM8650")])
    hostile_ctx = (pk.PackageFile("model_ctx.onnx", d("1"), 1),)
    graphs = ({"name": "prefill", "ctxModel": bad or "."},)
    group = {"graphs": [{"name": "prefill"}]}
    with pytest.raises(UnsafePathError):
        pk.plan(package_name="m", package_version="t", model=MODEL, group=group,
                model_files=[{"path": "group.json", "digest": d("9"), "size": 1},
                             {"path": "g0/g0.onnx", "digest": d("b"), "size": 5}],
                builds=[build("SM8650", graphs=graphs, files=hostile_ctx)])


def test_asset_uri_is_orts_directory_hash(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "w.bin").write_bytes(b"weights")
    (tmp_path / "sub" / "t.json").write_bytes(b"{}")
    files = [pk.PackageFile(p, "sha256:" + hashlib.sha256(b).hexdigest(), len(b))
             for p, b in (("w.bin", b"weights"), ("sub/t.json", b"{}"))]
    uri = pk.asset_uri(files)
    assert uri == pk.asset_uri(list(reversed(files)))  # order does not matter
    assert uri != pk.asset_uri([pk.PackageFile("w2.bin", files[0].digest, 7), files[1]])  # names do
    ort = pytest.importorskip("onnxruntime")
    if not hasattr(ort, "ModelPackage"):
        pytest.skip("onnxruntime < 1.32 has no ModelPackage")
    assert ort.ModelPackage.compute_directory_hash(str(tmp_path)) == uri


def test_compatibility_string_prefers_the_recorded_one():
    meta = {"ep_compatibility_info.QNNExecutionProvider": "v2:from-model"}
    assert pk.compatibility_string("qnn", {}, meta) == "v2:from-model"
    assert pk.compatibility_string("qnn", {"compatibility": {"QNNExecutionProvider": "v2:recorded"}}, meta) == "v2:recorded"
    assert pk.compatibility_string("qnn", {}, {}) is None
    assert pk.compatibility_string("trt", {}, meta) is None
    assert pk.compatibility_string("cpu", {}, meta) is None


def test_inputs_key_changes_with_a_new_build_only():
    a = pk.inputs_key(MODEL, "m", "t", [d("1"), d("2")])
    assert a == pk.inputs_key(MODEL, "m", "t", [d("2"), d("1")])
    assert a != pk.inputs_key(MODEL, "m", "t", [d("1"), d("2"), d("3")])
    assert a != pk.inputs_key(MODEL, "m", "t2", [d("1"), d("2")])
    assert a != pk.inputs_key(d("b"), "m", "t", [d("1"), d("2")])


def _record(**over):
    doc = {"kind": pk.PACKAGE_KIND, "files": [{"path": "manifest.json", "digest": d("1"), "size": 3},
                                              {"path": "c0/cpu/model.onnx", "digest": d("2"), "size": 3}],
           "directories": ["c0/cpu", "c0/v0"]}
    doc.update(over)
    return doc


@pytest.mark.parametrize("change", [
    {"kind": "something-else"},
    {"files": "nope"},
    {"files": [{"path": "../x", "digest": d("1"), "size": 1}, {"path": "manifest.json", "digest": d("1"), "size": 1}]},
    {"files": [{"path": "manifest.json", "digest": "md5:00", "size": 1}]},
    {"files": [{"path": "manifest.json", "digest": d("1"), "size": -1}]},
    {"files": [{"path": "manifest.json", "digest": d("1"), "size": 1}] * 2},
    {"files": [{"path": "c0/cpu/model.onnx", "digest": d("1"), "size": 1}]},  # no manifest
    {"files": [{"path": "manifest.json", "digest": d("1"), "size": 1}, {"path": "c0", "digest": d("1"), "size": 1},
               {"path": "c0/x", "digest": d("1"), "size": 1}]},  # c0 a file and a directory
    {"directories": ["/abs"]},
    {"directories": ["manifest.json"]},
])
def test_hostile_package_records_are_refused(change):
    assert pk.check_record(_record())  # the baseline is fine
    with pytest.raises(ManifestError):
        pk.check_record(_record(**change))


def test_packages_need_onnxruntime_1_32_where_they_are_made(monkeypatch):
    import importlib.metadata

    from farm.core.errors import MissingExtraError
    from workers import ortpackage

    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "1.31.1")
    with pytest.raises(MissingExtraError) as e:
        ortpackage.runtime()
    assert "onnxruntime 1.31.1" in e.value.message and "1.32" in e.value.hint
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "1.32.0")
    assert ortpackage.runtime() == "1.32.0"
