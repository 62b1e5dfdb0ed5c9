"""Calls recorded in a profile, replayed as themselves (the pipeline's exact replay)."""
