"""llmgw.engines."""
