"""llmgw.discovery."""
