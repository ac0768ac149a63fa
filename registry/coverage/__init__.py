"""Coverage for ops: what is built, failed or missing, per model x target x toolchain.

- ``matrix``: the whole matrix (``coverage``), folded in Python from every build of a filtered
  set of models: `farm coverage` without flags and GET /v1/coverage.
- ``summary``: SoC x SDK counts (``summary``) from the tables the triggers of migration 0008 keep
  (``registry.coverage_sql``), the scope filters, the fold and the self-check.
- ``pages``: models paged with a keyset cursor (``models_page``) from the same tables:
  `farm coverage --missing`, GET /v1/coverage/models and the /coverage page.
- ``cells``: what every view folds into a cell alike (SoCs of a target, partial offload, why a
  cell can't be verified here, tags).
- ``llm``: an LLM (genai package) is one model: its parts are counted under it, not as models.

A model is its digest: a digest with three tags is one row with three tags, and a tag moved to
another digest leaves the old digest's row in place (its artifacts still exist)."""

from __future__ import annotations

from registry.coverage.cells import as_aware, socs, unverifiable
from registry.coverage.matrix import Cell, Coverage, Evidence, coverage
from registry.coverage.pages import CELL_STATES, PAGE_MAX, ModelCoverage, Page, decode_cursor, encode_cursor, models_page
from registry.coverage.summary import (
    COMPACT_OVER,
    SUBSET_MAX,
    Scope,
    Summary,
    SummaryRow,
    compact,
    rebuild,
    recomputed_matches,
    scope,
    summary,
)

__all__ = ["CELL_STATES", "COMPACT_OVER", "PAGE_MAX", "SUBSET_MAX", "Cell", "Coverage", "Evidence", "ModelCoverage",
           "Page", "Scope", "Summary", "SummaryRow", "as_aware", "compact", "coverage", "decode_cursor",
           "encode_cursor", "models_page", "rebuild", "recomputed_matches", "scope", "socs", "summary",
           "unverifiable"]
