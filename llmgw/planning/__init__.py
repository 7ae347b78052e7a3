"""llmgw.planning."""
