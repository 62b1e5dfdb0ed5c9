"""The position-encoding ops."""
