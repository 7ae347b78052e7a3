"""llmgw.proto."""
