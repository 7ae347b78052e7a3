"""llmgw.metrics."""
