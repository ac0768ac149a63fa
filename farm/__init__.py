"""ctxfarm's product package: front doors (cli/, api/, client/), the build pipeline (pipeline/)
and the core every layer uses (core/); they are different layers (the contracts in pyproject.toml).
Import-light: importing ``farm`` loads nothing; no module under farm/ imports onnxruntime or infra/."""

from __future__ import annotations

__version__ = "0.1.0"
