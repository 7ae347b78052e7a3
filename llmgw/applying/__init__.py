"""llmgw.applying."""
