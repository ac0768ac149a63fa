"""Artifact registry: content-addressed blob store + SQL index + resolve/verify.

Never imports onnxruntime; ``onnx`` only where a context model is inspected.
"""

from __future__ import annotations
