"""What an engine adapter renders for one shard, before user args are added."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Parts:
    """An engine's own argv, the commands before it, and the environment it needs."""

    argv: list[str]
    prelude: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    options_from: int = 0  # argv[options_from:] are options the flag table checks
    takes_args: bool = True  # False for a process that is not the engine (a Ray worker)
    # Options that take several values (vLLM's --lora-modules a=x b=y), appended after
    # argv: the flag table knows one value per option, so each is checked with its first.
    multi: list[list[str]] = field(default_factory=list)
