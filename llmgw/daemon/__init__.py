"""llmgw.daemon."""
