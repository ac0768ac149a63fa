"""``farm promote --require``: the clauses, the usage error naming a bad one, and the account."""

from __future__ import annotations

import pytest

from farm.core.errors import UsageError
from farm.core.requirements import Requirement, parse


def test_the_four_clauses() -> None:
    assert parse("devices>=2 per soc,psnr>=30,p50_ms<=20") == Requirement(2, 0, 30.0, 20.0)
    assert parse(" devices >= 3 ") == Requirement(0, 3, None, None)
    assert parse("DEVICES>=1 PER SOC") == Requirement(1, 0, None, None)
    assert parse("psnr>=30.5").min_psnr == 30.5


@pytest.mark.parametrize("expr, named", [("devices>=2 per soc,psnr>30", "psnr>30"), ("p50_ms>=3", "p50_ms>=3"),
                                         ("devices>=0", "devices>=0"), ("psnr>=30,,", ""), ("rm -rf", "rm -rf"),
                                         ("devices>=2 per board", "devices>=2 per board")])
def test_anything_else_is_a_usage_error_naming_the_clause(expr: str, named: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(expr)
    assert repr(named) in err.value.message or (named == "" and "''" in err.value.message)


def test_empty_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse("")


def _r(device: str, **over: object) -> dict[str, object]:
    return {"device": device, "simulator": False, "outcome": "ok", "psnr_db": 70.0, "p50_ms": 2.0, "struck": None,
            **over}


def test_account_per_soc_counts_distinct_devices_that_meet_the_thresholds() -> None:
    req = parse("devices>=2 per soc,psnr>=30,p50_ms<=5")
    evidence = {"SM8650": [_r("a"), _r("b"), _r("b")],
                "SM8750": [_r("c"), _r("d", psnr_db=9.0), _r("e", p50_ms=9.0), _r("f", outcome="fails"),
                           _r("g", simulator=True), _r("h", struck="device revoked")]}
    got = req.account(evidence, allow_simulator=False)
    assert got["met"] is False
    assert got["socs"]["SM8650"] == {**got["socs"]["SM8650"], "devices": ["a", "b"], "missing": 0}
    cell = got["socs"]["SM8750"]
    assert cell["devices"] == ["c"] and cell["missing"] == 1
    assert [w["why"].split(" ")[0] for w in cell["not_counted"]] == ["psnr", "p50_ms", "outcome", "simulator", "struck:"]
    assert req.account(evidence, allow_simulator=True)["socs"]["SM8750"]["devices"] == ["c", "g"]
    assert req.account(evidence, allow_simulator=True)["met"] is True


def test_account_total_devices() -> None:
    req = parse("devices>=3")
    assert req.account({"SM8650": [_r("a"), _r("b")]}, False)["met"] is False
    assert req.account({"SM8650": [_r("a"), _r("b")], "SM8750": [_r("c")]}, False)["met"] is True
    assert parse("psnr>=30").account({"SM8650": [_r("a")], "SM8750": []}, False)["met"] is False
