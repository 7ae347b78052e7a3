"""Rendering: systemd units and env files from jinja2 templates.

The templates live in the top-level ``templates/`` directory and ship inside
the wheel as ``llmgw/templates``. :func:`units.render` is the entry point;
:mod:`.quoting` knows systemd's quoting rules.
"""
