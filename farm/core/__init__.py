"""The bottom layer, for every other: errors (the leaf), settings, keys, catalog/ (targets as data),
options, bundle, names, placement, text, times.
Imports nothing from the project outside farm.core (an import-linter contract checks it)."""
