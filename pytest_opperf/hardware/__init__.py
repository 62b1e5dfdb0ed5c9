"""The hardware side: peak tables (data/hardware.yaml, every figure with its source), device
detection, and the metrics taken against the peaks (MFU, MBU)."""
