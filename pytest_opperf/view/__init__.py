"""Looking at stored results: the per-op summary, plots (roofline, lines, speedup, device vs
device), the self-contained HTML report, CSV/JSON exports and Datasette metadata. Reads result
databases read-only; uses store/, hardware/ and gate/ (config/ to expand the shipped configs, the
dtype table pytest_opperf/dtypes.py for names), and nothing here writes a database."""
