"""ctxfarm control plane: settings, keys, catalog, submission, CLI.

Kept import-light: nothing here imports onnxruntime, SQLAlchemy or boto3 at package import.
"""

from __future__ import annotations

__version__ = "0.1.0"
