"""The hardware side: peak tables (data/hardware.yaml, every figure with its source), device
detection, and the metrics taken against the peaks (MFU, MBU).

The config language lives in pytest_opperf/config/, the one dtype table in pytest_opperf/dtypes.py.
"""
