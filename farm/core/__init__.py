"""Core types every layer may use: errors, settings, keys, catalog, options, bundle, names.

The lowest layer: it imports nothing else from the project (an import-linter contract checks it).
"""
