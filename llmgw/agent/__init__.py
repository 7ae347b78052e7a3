"""llmgw.agent."""
