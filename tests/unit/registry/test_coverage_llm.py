"""An LLM (genai package) is one model in coverage: its parts (each a weight-shared group build
of a model digest of its own) are counted under it, not as models, in the whole matrix, the
summary's MODELS and the pages; its cells carry the twin's figure; and `farm coverage`'s
tables say so (parts under the LLM, twin in the cell and the legend, `--verdicts` unverified
rather than "not probed", `--missing` naming what failed on older SDKs)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from sqlalchemy import text

from farm.pipeline import states
from registry.coverage import coverage, models_page, recomputed_matches, summary
from registry.coverage.summary import Scope
from registry.models import GenaiPart
from tests.common.index_rows import add_artifact, add_model, spec

TWIN = {"status": "ok", "tokens_compared": 16, "tokens_matched": 15}


def _failed(s: Any, digest: str, toolchain: str, code: str = "toolchain-error") -> int:
    build_id, _ = states.enqueue(s, spec(digest, toolchain=toolchain), None)
    claim = states.claim(s, build_id, owner="test", lease_seconds=60, max_attempts=3)
    assert claim.lease is not None
    states.fail(s, claim.lease, code, "it failed", None)
    return build_id


def add_llm(db: Any) -> dict[str, str]:
    """llm/tiny:t: built with QNN 2.51.0 (its twin 15/16), failed with 2.47.0 and 2.49.40; two parts
    (group builds of their own digests) linked to each package build; and a plain model beside it."""
    with db.session() as s:
        pkg = add_model(s, "llm", "llm/tiny").digest
        s.execute(text("INSERT INTO tags (name, tag, model_digest, updated_at) VALUES ('llm/tiny', 't', :d, "
                       "CURRENT_TIMESTAMP)"), {"d": pkg})
        parts = [add_model(s, f"part{i}", f"part{i}").digest for i in (0, 1)]
        plain = add_model(s, "plain", "plain").digest
        add_artifact(s, plain)
        built = [add_artifact(s, p) for p in parts]
        art = add_artifact(s, pkg)
        s.execute(text("UPDATE artifacts SET ctx_model = 'genai_config.json', description = :d WHERE id = :i"),
                  {"d": json.dumps({"twin": TWIN}), "i": art.id})
        s.add_all([GenaiPart(package_build_id=art.build_id, part=i, part_build_id=a.build_id)
                   for i, a in enumerate(built)])
        for tc in ("2.47.0", "2.49.40"):
            part_builds = [_failed(s, p, tc) for p in parts]
            package_build = _failed(s, pkg, tc)
            s.add_all([GenaiPart(package_build_id=package_build, part=i, part_build_id=b)
                       for i, b in enumerate(part_builds)])
    return {"package": pkg, "part0": parts[0], "part1": parts[1], "plain": plain}


def test_an_llm_is_one_model_with_its_parts_under_it(db: Any) -> None:
    d = add_llm(db)
    with db.session() as s:
        doc = coverage(s).to_dict()
        only = coverage(s, models=["llm/tiny:t"]).to_dict()
        farm_rows = summary(s).to_dict()["rows"]
        llm_rows = summary(s, Scope(prefix="llm")).to_dict()["rows"]
        page = models_page(s)
        assert recomputed_matches(s) == []
    assert sorted(m["digest"] for m in doc["models"]) == sorted([d["package"], d["plain"]])
    assert {c["model"] for c in doc["cells"]} == {d["package"], d["plain"]}
    (llm,) = [m for m in doc["models"] if m["digest"] == d["package"]]
    assert llm["parts"] == [d["part0"], d["part1"]]
    cells = {c["toolchain"]: c for c in doc["cells"] if c["model"] == d["package"]}
    assert cells["2.51.0"]["twin"] == "15/16" and cells["2.47.0"]["twin"] is None
    assert [(p["part"], p["model"], p["state"]) for p in cells["2.51.0"]["parts"]] == [
        (0, d["part0"], "built"), (1, d["part1"], "built")]
    assert [p["state"] for p in cells["2.49.40"]["parts"]] == ["failed(toolchain-error)"] * 2
    assert [m["digest"] for m in only["models"]] == [d["package"]] and len(only["cells"]) == 3
    # The summary's MODELS: the LLM and the plain model, not their parts.
    assert {(r["toolchain"], r["models"], r["built"], r["failed"]) for r in farm_rows} == {
        ("2.47.0", 2, 0, 1), ("2.49.40", 2, 0, 1), ("2.51.0", 2, 2, 0)}
    assert {(r["toolchain"], r["models"]) for r in llm_rows} == {("2.47.0", 1), ("2.49.40", 1), ("2.51.0", 1)}
    assert sorted(m.digest for m in page.models) == sorted([d["package"], d["plain"]])
    (paged,) = [m for m in page.models if m.digest == d["package"]]
    assert {c["toolchain"]: c.get("twin") for c in paged.cells}["2.51.0"] == "15/16"


def test_the_cli_tables_show_the_llm_its_parts_and_twin(db: Any, capsys: Any) -> None:
    from farm.cli.ops_cmd import _print_coverage, _print_missing_pages

    d = add_llm(db)
    with db.session() as s:
        doc = coverage(s).to_dict()
        assert _print_coverage(doc, argparse.Namespace(json=False, verdicts=False)) == 0
        table = capsys.readouterr().out
        assert _print_coverage(doc, argparse.Namespace(json=False, verdicts=True)) == 0
        verdicts = capsys.readouterr().out
        rc = _print_missing_pages(lambda state, cursor: models_page(s, state=state, cursor=cursor).to_dict(),
                                  argparse.Namespace(json=False, target=None))
        missing = capsys.readouterr().out
    lines = table.splitlines()
    llm = next(i for i, line in enumerate(lines) if line.startswith(d["package"][7:19]))
    assert "built unverified twin 15/16" in lines[llm]
    assert lines[llm + 1].startswith("  part0") and lines[llm + 2].startswith("  part1"), table
    assert d["part0"][7:19] not in table and "twin N/M" in table
    row = next(line for line in verdicts.splitlines() if line.startswith(d["package"][7:19]) and "2.51.0 " in line)
    assert row.rstrip().endswith("unverified twin 15/16"), verdicts
    assert rc == 0 and "nothing missing for the newest toolchains: qnn 2.51.0" in missing
    assert "failed on older SDKs (2 cell(s)" in missing and "llm/tiny:t qnn:SM8650 2.47.0 (toolchain-error)" in missing
