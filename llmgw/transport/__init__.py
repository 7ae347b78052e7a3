"""llmgw.transport."""
