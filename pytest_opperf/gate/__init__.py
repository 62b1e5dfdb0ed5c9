"""The CI gate: baselines, verdicts against them, and the gate's reports."""
