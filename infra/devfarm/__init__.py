"""The dev launcher: real Redis, PostgreSQL and SeaweedFS on free ports, and a local farm on them.

A tool for this repository (infra/farm-up.sh, the integration tests, bench/), not part of the
product: nothing under farm/, registry/ or workers/ imports it (an import-linter contract says so).
It may import the product packages; run it from the repository root (``python -m infra.devfarm``).
"""
