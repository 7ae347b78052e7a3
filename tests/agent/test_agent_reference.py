"""docs/agent-reference.md: generated from llmgw/agent/settings.py, and complete.

A setting added to the code fails here until the reference names it: the committed page
must equal what ``python -m llmgw.agent.reference`` renders now, and every model an
``agent.yaml`` can hold (walked from :class:`Settings`, not listed by hand) must have a
section whose table has a described line for each of its fields.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from llmgw.agent import reference, settings
from llmgw.spec import reference as spec_reference

ROOT = Path(__file__).resolve().parents[2]


def tables(text: str) -> dict[str, str]:
    """Each section's text by its heading."""
    parts = re.split(r"^## `([^`]+)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_agent_reference_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "agent-reference.md").read_text()
    assert committed == reference.render(), "run `make docs` to regenerate the reference"


def test_every_model_of_agent_yaml_has_a_section() -> None:
    sectioned = [model for _, model, _ in reference.SECTIONS]
    under = spec_reference.models_under(settings.Settings)
    missing = [m.__name__ for m in under if m not in sectioned]
    assert not missing, f"no section in llmgw/agent/reference.py for {missing}"


@pytest.mark.parametrize("heading,model", [(h, m) for h, m, _ in reference.SECTIONS],
                         ids=[h for h, _, _ in reference.SECTIONS])
def test_every_setting_has_a_described_line(heading: str, model: type[BaseModel]) -> None:
    table = tables(reference.render())[heading]
    for name, info in model.model_fields.items():
        assert f"| `{info.alias or name}` |" in table, f"{heading}: no line for {name}"
        assert info.description, f"{model.__name__}.{name} has no description"


def test_relative_paths_named_are_the_ones_resolved(tmp_path: Path) -> None:
    """The intro's list of relative paths is what load() really resolves."""
    (tmp_path / "agent.yaml").write_text(
        "socket: {path: s}\nstate_dir: st\nhardware: {sysfs_root: sy, proc_root: pr}\n"
        "systemd: {unit_dir: u, env_dir: e}\ndeclared: {weights_dirs: [w]}\n")
    loaded = settings.load(tmp_path / "agent.yaml")
    values = [loaded.socket.path, loaded.state_dir, loaded.hardware.sysfs_root,
              loaded.hardware.proc_root, loaded.systemd.unit_dir, loaded.systemd.env_dir,
              *loaded.declared.weights_dirs]
    assert all(v.startswith(str(tmp_path.resolve()) + "/") for v in values), values
    named = re.findall(r"`([a-z_.]+)`", reference.intro().split("each with its own file:")[1]
                       .split(";")[0])
    assert sorted(named) == sorted(["socket.path", "state_dir", "hardware.sysfs_root",
                                    "hardware.proc_root", "systemd.unit_dir",
                                    "systemd.env_dir", "declared.weights_dirs"])
