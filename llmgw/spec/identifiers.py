"""Strict patterns for every cluster string that names something, and the text rule.

Cluster files come from pull requests, and their strings end up in systemd
units that run as root. Two rules keep a string from changing a unit's shape:

* an *identifier* (a model or node name, ``served_name``, an interface or
  adapter name, an address, a label key, an engine flag or variable name)
  must match its pattern here, checked by ``llmgw validate`` with the place
  of the offending value;
* *free text* (engine arguments, environment values, paths, ``source``) may
  hold anything but a NUL or a lone surrogate, which no command line,
  environment or UTF-8 file can carry; :mod:`llmgw.rendering.quoting`
  escapes the rest for where it lands.

Each pattern is also in the JSON Schema (``llmgw schema``), so editors flag a
bad value as it is typed. A purely computational module.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field

# An http(s) URL of a host (or address) and a plain path: hub mirrors, OpenID issuers.
HTTP_URL = re.compile(r"^https?://[A-Za-z0-9.\[\]:-]+(/[A-Za-z0-9._~/-]*)?$")

# name: (pattern, what it is, what it may hold) — the loader words its errors from this.
PATTERNS: dict[str, tuple[str, str]] = {
    "name": (r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$",
             "lowercase letters, digits, '.', '_' and '-', starting and ending with a "
             "letter or digit"),
    "served_name": (r"^[A-Za-z0-9]([A-Za-z0-9._:/@+-]{0,126}[A-Za-z0-9])?$",
                    "letters, digits, '.', '_', ':', '/', '@', '+' and '-' (at most 128), "
                    "starting and ending with a letter or digit"),
    "model_pattern": (r"^[A-Za-z0-9._:/@+*?-]{1,128}$",
                      "a served model name, or a glob of one: letters, digits, '.', '_', "
                      "':', '/', '@', '+' and '-', with '*' for any run of characters and "
                      "'?' for one (at most 128)"),
    "interface": (r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,14}$",
                  "a Linux interface name: at most 15 letters, digits, '.', '_', '@' and '-', "
                  "starting with a letter or digit"),
    "adapter": (r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                "an RDMA device name as in /sys/class/infiniband, such as mlx5_0"),
    "label_key": (r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$",
                  "letters, digits, '.', '_', '/' and '-', starting and ending with a "
                  "letter or digit"),
    "flag": (r"^-{0,2}[A-Za-z0-9][A-Za-z0-9._-]{0,79}$",
             "an engine flag such as max-model-len: letters, digits, '.', '_' and '-'"),
    "engine version": (r"^\d+(\.\d+){0,3}([.-]?(post|rc|dev)\d+)?$",
                       "a release such as 0.11.0 or 0.11.0rc1: up to four numbers "
                       "separated by '.', then a post, rc or dev number"),
    "index URL": (r"^https?://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+$",
                  "an http(s) URL of a package index, such as https://pypi.org/simple"),
    "variable": (r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
                 "an environment variable name: letters, digits and '_', not starting "
                 "with a digit"),
}

_HOST_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
ADDRESS_RULE = ("an IPv4 or IPv6 address, a host name (letters, digits and '-' in labels "
                "separated by '.'), or `local`")


def _pattern(kind: str) -> str:
    return PATTERNS[kind][0]


def describe(pattern: str) -> tuple[str, str] | None:
    """(kind, rule) of one of our patterns, for an error message; None for another."""
    for kind, (known, rule) in PATTERNS.items():
        if known == pattern:
            return kind, rule
    return None


def is_address(text: str) -> bool:
    """``local``, an IP address (no zone index), or an RFC 1123 host name."""
    if text == "local":
        return True
    try:
        ipaddress.ip_address(text)
        return "%" not in text
    except ValueError:
        pass
    if not text or len(text) > 253:
        return False
    labels = text.removesuffix(".").split(".")
    if labels[-1].isdigit():
        return False  # a dotted number that is not an IPv4 address (999.1.1.1)
    return all(_HOST_LABEL.match(label) for label in labels)


def check_address(text: str) -> str:
    if not is_address(text):
        raise ValueError(f"invalid address {show(text)}: use {ADDRESS_RULE}")
    return text


def check_text(value: object) -> object:
    """Free text may hold anything a command line and a UTF-8 file can: no NUL, no surrogate."""
    for text in _strings(value):
        if "\x00" in text:
            raise ValueError(f"{show(text)} contains a NUL character, which no command line "
                             "or environment can hold")
        if any("\ud800" <= char <= "\udfff" for char in text):
            raise ValueError(f"{show(text)} is not valid Unicode (a lone surrogate)")
    return value


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings(item)]
    return []  # numbers, booleans; a nested model checks its own fields


def show(value: object) -> str:
    """A value for an error message: repr (control characters escaped), at most 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


Name = Annotated[str, Field(pattern=_pattern("name"))]
ServedName = Annotated[str, Field(pattern=_pattern("served_name"))]
ModelPattern = Annotated[str, Field(pattern=_pattern("model_pattern"))]
Interface = Annotated[str, Field(pattern=_pattern("interface"))]
Adapter = Annotated[str, Field(pattern=_pattern("adapter"))]
LabelKey = Annotated[str, Field(pattern=_pattern("label_key"))]
Flag = Annotated[str, Field(pattern=_pattern("flag"))]
Variable = Annotated[str, Field(pattern=_pattern("variable"))]
Address = Annotated[str, AfterValidator(check_address)]
