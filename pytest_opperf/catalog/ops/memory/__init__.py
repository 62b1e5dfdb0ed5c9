"""The memory ops."""
