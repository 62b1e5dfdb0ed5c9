"""Looking at stored results: the per-op summary, plots (roofline, lines, speedup, device vs
device), the self-contained HTML report, CSV/JSON exports and Datasette metadata. Reads result
databases read-only; uses store/, hardware/ and gate/, and nothing here writes a database."""
