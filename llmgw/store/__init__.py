"""llmgw.store."""
