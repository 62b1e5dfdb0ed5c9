"""The CI gate: baselines, verdicts against them, and the gate's reports.

The config language lives in pytest_opperf/config/, the one dtype table in pytest_opperf/dtypes.py.
"""
