"""Shared pytest setup: fixture plugins live in tests/support/."""

pytest_plugins = ["support.plugin", "support.leaks", "support.tiers", "support.machines"]
