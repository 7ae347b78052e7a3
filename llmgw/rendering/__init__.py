"""llmgw.rendering."""
