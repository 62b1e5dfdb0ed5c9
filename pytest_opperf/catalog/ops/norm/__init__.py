"""The norm ops."""
