"""The artifact registry: the SQL index (db, models, index, reads), blob stores (store/), manifest,
resolve, verify, signing, tokens, coverage, and the device-side install.
Imports only farm.core (onnx where a context model is read); never the pipeline, front doors, workers/ or onnxruntime."""

from __future__ import annotations
