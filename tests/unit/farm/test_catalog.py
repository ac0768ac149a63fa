from __future__ import annotations

import pytest

from farm.core.catalog import BACKENDS, _load, load_catalog, parse_target
from farm.core.errors import UnknownTargetError

SOCS = [
    ("SM8350", 30, "v68"),
    ("SM8450", 36, "v69"),
    ("SM8475", 42, "v69"),
    ("SM8550", 43, "v73"),
    ("SC8380XP", 60, "v73"),
    ("SM8650", 57, "v75"),
    ("SM8750", 69, "v79"),
    ("SM8850", 87, "v81"),
    ("QCS9100", 77, "v73"),
]


@pytest.mark.parametrize("name,soc_model,htp_arch", SOCS)
def test_soc_ids_and_htp_arch(name, soc_model, htp_arch):
    t = parse_target(f"qnn:{name}")
    assert (t.backend, t.name, t.soc_model, t.htp_arch) == ("qnn", name, soc_model, htp_arch)
    assert t.ref == f"qnn:{name}"
    assert t.htp_arch_number == int(htp_arch[1:])
    assert t.compute_capability is None


def test_catalog_entries_are_well_formed():
    cat = load_catalog()
    assert {t.backend for t in cat.targets} == set(BACKENDS)
    for t in cat.of_backend("qnn"):
        assert isinstance(t.soc_model, int) and t.htp_arch and t.htp_arch.startswith("v")
    for t in cat.of_backend("trt"):
        assert t.name == "sm_" + t.compute_capability.replace(".", "")
    # No two targets of a backend may answer to the same name or alias.
    for backend in BACKENDS:
        keys = [k.lower() for t in cat.of_backend(backend) for k in (t.name, *t.aliases)]
        assert len(keys) == len(set(keys)), backend


@pytest.mark.parametrize("ref", ["qnn:snapdragon-8-gen-3", "qnn:SNAPDRAGON-8-GEN-3", "qnn:sm8650", "QNN:Sm8650",
                                 " qnn:SM8650 ", "qnn:8gen3", "qnn:snapdragon_8_gen_3"])
def test_aliases_and_case_insensitivity(ref):
    assert parse_target(ref).name == "SM8650"


@pytest.mark.parametrize("ref,name,cc", [("trt:sm_90", "sm_90", "9.0"), ("trt:H100", "sm_90", "9.0"),
                                         ("trt:SM-86", "sm_86", "8.6"), ("trt:t4", "sm_75", "7.5")])
def test_trt_targets(ref, name, cc):
    t = parse_target(ref)
    assert (t.backend, t.name, t.compute_capability, t.soc_model) == ("trt", name, cc, None)


def test_bare_name_with_backend_argument():
    assert load_catalog().get("SM8550", backend="qnn").soc_model == 43


def test_unknown_target_lists_known_names():
    with pytest.raises(UnknownTargetError) as info:
        parse_target("qnn:SM9999")
    exc = info.value
    assert exc.code == "unknown-target"
    assert "SM9999" in exc.message
    for name, _, _ in SOCS:
        assert name in exc.hint
    assert "sm_90" not in exc.hint  # only the asked backend's targets
    assert "SM8650" in exc.details["known"]


def test_unknown_backend():
    with pytest.raises(UnknownTargetError) as info:
        parse_target("npu:SM8650")
    assert info.value.code == "unknown-target"
    assert "npu" in info.value.message
    assert "qnn" in info.value.hint and "trt" in info.value.hint


def test_missing_prefix():
    with pytest.raises(UnknownTargetError) as info:
        parse_target("SM8650")
    assert info.value.code == "unknown-target"
    assert "prefix" in info.value.message
    assert "qnn:SM8650" in info.value.hint


def test_soc_name_under_the_wrong_backend_is_unknown():
    with pytest.raises(UnknownTargetError):
        parse_target("trt:SM8650")


def test_load_reads_toml_rows():
    cat = _load('[[qnn]]\nname = "X1"\nsoc_model = 1\nhtp_arch = "v99"\naliases = ["x-one"]\n'
                '[[trt]]\nname = "sm_1"\ncompute_capability = "0.1"\n')
    assert cat.get("qnn:x-one").soc_model == 1
    assert cat.get("trt:sm_1").compute_capability == "0.1"
    assert [t.name for t in cat.targets] == ["X1", "sm_1"]
