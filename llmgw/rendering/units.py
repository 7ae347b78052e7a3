"""One shard's systemd unit and env file, from the jinja2 templates.

Usage::

    files = units.render(units.UnitSpec(...))
    files.name, files.unit_text, files.env_text, files.secret_env

A purely computational module: the templates are read from the package
when the module is imported, like code; rendering reads and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from llmgw.rendering import quoting

DEFAULT_ENV_DIR = "/etc/llmgw/env"
DEFAULT_STOP_TIMEOUT = "2min"  # engines drain requests and free GPU memory on SIGTERM
STOP_TIMEOUT_SECONDS = 120.0  # DEFAULT_STOP_TIMEOUT in seconds, for whoever waits for a stop
DEFAULT_RESTART_DELAY = "10s"


@dataclass(frozen=True)
class UnitSpec:
    """Everything a unit file says about one shard."""

    name: str  # llmgw-<model>-r<replica>-s<rank>.service
    model: str
    replica: int
    rank: int
    ranks: int
    node: str
    engine: str
    digest: str
    spec_json: str  # compact, ASCII-only: the X-Llmgw-Spec label
    argv: tuple[str, ...]
    port: int | None = None  # HTTP port the agent polls; None for worker shards
    served_name: str = ""  # the name /v1/models must list before the shard is ready
    prelude: tuple[tuple[str, ...], ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # from the placement: Environment= lines
    user_env: tuple[tuple[str, str], ...] = ()  # the profile's env: the env file
    secret_env: tuple[tuple[str, str], ...] = ()  # variable → file on the node


@dataclass(frozen=True)
class UnitFiles:
    """What the agent receives for one unit."""

    name: str
    unit_text: str
    env_text: str
    secret_env: tuple[tuple[str, str], ...]


def render(
    unit: UnitSpec,
    *,
    env_dir: str = DEFAULT_ENV_DIR,
    stop_timeout: str = DEFAULT_STOP_TIMEOUT,
    restart_delay: str = DEFAULT_RESTART_DELAY,
) -> UnitFiles:
    """The unit text and env file text of one shard."""
    argv = quoting.shell_script(unit.prelude, unit.argv) if unit.prelude else list(unit.argv)
    context = {
        "unit": unit,
        "exec_start": quoting.exec_line(argv),
        "env_dir": env_dir.rstrip("/"),
        "stop_timeout": stop_timeout,
        "restart_delay": restart_delay,
    }
    return UnitFiles(
        name=unit.name,
        unit_text=UNIT_TEMPLATE.render(context),
        env_text=ENV_TEMPLATE.render(context),
        secret_env=unit.secret_env,
    )


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("llmgw", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # systemd units, not HTML
        auto_reload=False,  # read once: rendering never touches the disk again
    )
    env.filters["systemd_env"] = quoting.systemd_env
    env.filters["env_file_value"] = quoting.env_file_value
    env.filters["label"] = quoting.label
    return env


# Loaded with the module, like code: a plan renders units without any I/O.
_TEMPLATES = _environment()
UNIT_TEMPLATE = _TEMPLATES.get_template("unit.service.j2")
ENV_TEMPLATE = _TEMPLATES.get_template("unit.env.j2")
