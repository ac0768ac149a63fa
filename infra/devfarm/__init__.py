"""The dev launcher: real Redis, PostgreSQL and SeaweedFS on free ports (services) and a local farm
on them (launcher: workers per QNN SDK venv, the API), for infra/farm-up.sh, the integration tests
and bench/. May import the product packages; nothing under farm/, registry/ or workers/ imports it.

A tool for this repository, not part of the product (an import-linter contract says so). Run it
from the repository root: ``python -m infra.devfarm``.
"""
