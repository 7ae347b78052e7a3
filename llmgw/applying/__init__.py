"""Carry out plans through the node agents; wait for readiness; say what happened."""
