"""Where rows go: the per-device SQLite database (schema, upsert, merge) and exports.

The config language lives in pytest_opperf/config/, the one dtype table in pytest_opperf/dtypes.py.
"""
