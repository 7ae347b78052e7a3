"""llmgw: declarative LLM serving for GPU fleets you own."""

__version__ = "0.1.0"
