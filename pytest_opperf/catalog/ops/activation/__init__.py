"""The activation ops."""
