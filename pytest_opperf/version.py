"""The package version: one place, imported wherever a run records it."""

__version__ = "0.1.0"
