"""What a worker environment makes besides context binaries (farm.core.capabilities): the probe's
facts as capabilities, and an LLM release's fan-out decided from the fleet's announcements before
anything compiles: an SDK that can't make the package left out with one warning, refused when
named with --sdk, a non-QNN target refused, everything refused when nothing can make it."""

from __future__ import annotations

import pytest

from farm.core import capabilities as C
from farm.core.errors import DETERMINISTIC_FAILURES, CapabilityMissingError

ABLE = C.from_probe({"onnxruntime": "1.32.0", "model_package": True, "genai": "0.18.0", "genai_ep": True}, "qnn")
NO_GENAI = C.from_probe({"onnxruntime": "1.24.4", "model_package": False,
                         "genai_error": "ModuleNotFoundError: No module named 'onnxruntime_genai'"}, "qnn")
SERVED = [("qnn", "2.47.0"), ("qnn", "2.49.40"), ("qnn", "2.51.0")]
FLEET = {("qnn", "2.47.0"): NO_GENAI, ("qnn", "2.49.40"): ABLE, ("qnn", "2.51.0"): ABLE}


def test_a_probe_with_genai_0_18_and_the_qnn_ep_makes_everything() -> None:
    assert ABLE.makes == frozenset(C.ALL) and not ABLE.lacks


def test_a_probe_without_genai_makes_nothing_and_says_why() -> None:
    assert NO_GENAI.makes == frozenset()
    assert "No module named 'onnxruntime_genai'" in NO_GENAI.why(C.GENAI_PACKAGE)
    assert "1.24.4" in NO_GENAI.why(C.ORT_MODEL_PACKAGE)


@pytest.mark.parametrize("probe, why", [
    ({"onnxruntime": "1.24.4", "genai": "0.12.2", "genai_ep": True}, "0.12.2 is older than 0.18"),
    ({"onnxruntime": "1.32.0", "genai": "0.18.0", "genai_ep_error": "RuntimeError: x"}, "can't register the QNN EP"),
])
def test_an_old_genai_or_one_that_cannot_register_qnn_makes_no_package(probe: dict[str, object], why: str) -> None:
    caps = C.from_probe(probe, "qnn")
    assert C.GENAI_PACKAGE not in caps.makes and why in caps.why(C.GENAI_PACKAGE)


def test_a_tensorrt_environment_makes_ort_packages_but_no_genai_package() -> None:
    caps = C.from_probe({"onnxruntime": "1.32.0", "model_package": True, "genai": "0.18.0"}, "trt")
    assert caps.makes == {C.ORT_MODEL_PACKAGE}


def test_the_announcement_round_trips_and_an_older_worker_announced_nothing() -> None:
    assert C.Capabilities.from_extra(NO_GENAI.to_extra()) == NO_GENAI
    assert C.Capabilities.from_extra({"target": "sm_90"}) is None
    assert C.Capabilities.from_extra({"makes": ["genai-package", "telepathy"]}).makes == {C.GENAI_PACKAGE}
    assert C.short_list(ABLE.makes) == "genai,folder-check,twin,ort-package" and C.short_list([]) == "-"


def test_without_sdk_an_sdk_that_cannot_is_left_out_with_one_warning() -> None:
    fan = C.genai_matrix(["qnn"], [], SERVED, FLEET)
    assert fan.versions == {"qnn": ["2.49.40", "2.51.0"]}
    assert [(b, v) for b, v, _ in fan.skipped] == [("qnn", "2.47.0")]
    warning = fan.warning()
    assert warning is not None and "\n" not in warning
    assert "QNN 2.47.0" in warning and "onnxruntime_genai" in warning and "QNN 2.49.40, QNN 2.51.0" in warning


def test_without_sdk_every_sdk_able_gives_no_warning() -> None:
    fan = C.genai_matrix(["qnn"], [], SERVED[1:], FLEET)
    assert fan.versions == {"qnn": ["2.49.40", "2.51.0"]} and fan.warning() is None


def test_an_sdk_named_that_cannot_is_refused_naming_those_that_can() -> None:
    with pytest.raises(CapabilityMissingError) as e:
        C.genai_matrix(["qnn"], ["2.47.0", "2.51.0"], SERVED, FLEET)
    assert "QNN 2.47.0" in e.value.message and "onnxruntime_genai" in e.value.message
    assert "QNN 2.49.40, QNN 2.51.0" in (e.value.hint or "")
    assert e.value.code == "capability-missing" and e.value.code in DETERMINISTIC_FAILURES


def test_an_sdk_named_that_no_worker_is_known_for_is_kept_for_allow_queue() -> None:
    assert C.genai_matrix(["qnn"], ["2.52.0"], SERVED, FLEET).versions == {"qnn": ["2.52.0"]}


def test_nothing_able_is_refused_before_anything_compiles() -> None:
    with pytest.raises(CapabilityMissingError, match="no live QNN worker can make a genai package"):
        C.genai_matrix(["qnn"], [], SERVED[:1], FLEET)
    old = {("qnn", "2.51.0"): None}  # workers of an older ctxfarm: nothing announced
    with pytest.raises(CapabilityMissingError, match="announce no capabilities"):
        C.genai_matrix(["qnn"], [], [("qnn", "2.51.0")], old)


def test_a_tensorrt_target_is_refused_as_such() -> None:
    with pytest.raises(CapabilityMissingError, match="QNN context binaries; a trt target") as e:
        C.genai_matrix(["qnn", "trt"], [], SERVED, FLEET)
    assert "qnn:" in (e.value.hint or "")


def test_the_embedded_farm_refuses_an_environment_without_genai() -> None:
    C.check_here("qnn", "2.51.0", ABLE)
    with pytest.raises(CapabilityMissingError, match=r"this environment \(QNN 2.47.0\)") as e:
        C.check_here("qnn", "2.47.0", NO_GENAI)
    assert "onnxruntime-genai==0.18.0" in (e.value.hint or "")
