"""Measuring one case: timers, statistics and the stopping rule, device state, the functional
check and the memory estimate. Knows nothing of pytest.

The config language lives in pytest_opperf/config/, the one dtype table in pytest_opperf/dtypes.py.
"""
