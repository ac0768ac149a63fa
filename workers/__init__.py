"""Compile workers, top down: the Celery front door (tasks, main), the runner registry (backends) beside
the ORT model package writer (ortpackage/), the backends (qnn/, trt/), then what they share (runner: types +
child harness; host; epcontext; childproc).
Each imports only what is below it, farm.pipeline (tasks, main), registry/ and farm.core; onnxruntime only in */child.py."""

from __future__ import annotations
