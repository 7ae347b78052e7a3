"""Property: a secret of any shape, planted anywhere a node or a cluster file can put text,
reaches no plan format and not the admin fleet JSON.

Each example plants one secret of every shape (:mod:`llmgw.spec.secrets`) — Hugging Face,
OpenAI-style, GitHub, AWS, JWT, a bearer header, a password in a URL, a secret-named
value, a long random string — around hypothesis's own text, into an engine's log tail, a
unit's detail, its last exit, the program holding its port, a node's error, a fetch's
error and the old args and env a running unit's spec label holds; then scans text,
JSON, Markdown (with and without ``--engine-output``) and the fleet snapshot for any of
them, or a 12-character part of one. The same secrets in a cluster file's args and env
are refused by ``llmgw validate``, located, and never echoed.

Bodies are drawn from a hash of a drawn seed, so every secret is as random as a real one
while hypothesis shrinks the seed, the shape and the text around it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_builders import cluster_from, fleet_from

from llmgw.fleet import redactions
from llmgw.fleet.types import Fetch, Fleet, NodeReport
from llmgw.planning import outputs, plans
from llmgw.spec import loading

NOW = 1_700_000_000.0
ALPHABET = string.ascii_letters + string.digits


def _body(seed: int, size: int, alphabet: str = ALPHABET) -> str:
    """``size`` characters of ``alphabet`` from a hash of ``seed``, with an upper-case
    letter, a lower-case letter and two digits in it (a real key mixes them too)."""
    raw = hashlib.shake_256(f"{seed}".encode()).digest(size)
    text = "".join(alphabet[byte % len(alphabet)] for byte in raw)
    return ("Q" + "r" + "47" + text)[:size] if alphabet == ALPHABET else text


# shape → (the text planted, the secret in it that must not come out)
def _planted(shape: str, seed: int) -> tuple[str, str]:
    if shape == "huggingface":
        secret = "hf_" + _body(seed, 34)
    elif shape == "openai":
        secret = "sk-proj-" + _body(seed, 40)
    elif shape == "github":
        secret = "ghp_" + _body(seed, 36)
    elif shape == "github_pat":
        secret = "github_pat_" + _body(seed, 60)
    elif shape == "aws":
        secret = "AKIA" + _body(seed, 16, string.ascii_uppercase + string.digits)
    elif shape == "jwt":
        payload = base64.urlsafe_b64encode(json.dumps({"sub": seed}).encode()).decode()
        secret = "eyJhbGciOiJIUzI1NiJ9." + payload.rstrip("=") + "." + _body(seed, 43)
    elif shape == "bearer":
        secret = _body(seed, 40)
        return f"Authorization: Bearer {secret}", secret
    elif shape == "url_password":
        secret = _body(seed, 14)
        return f"https://robot:{secret}@mirror.example/hub", secret
    elif shape == "named_value":
        secret = _body(seed, 18)
        return f"api_key={secret}", secret
    else:  # a long random string
        secret = _body(seed, 32 + seed % 33)
    return secret, secret


SHAPES = ("huggingface", "openai", "github", "github_pat", "aws", "jwt", "bearer",
          "url_password", "named_value", "random")
# Text around a secret: anything printable, spaces included, on one line.
AROUND = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40)


@st.composite
def plantings(draw: st.DrawFn) -> list[tuple[str, str]]:
    """One (line, secret) per shape, each line the secret between drawn texts."""
    out = []
    for shape in SHAPES:
        text, secret = _planted(shape, draw(st.integers(0, 2**64)))
        before, after = draw(AROUND), draw(AROUND)
        out.append((f"{before} {text} {after}", secret))
    return out


CLUSTER = {
    "nodes": {"cpu-01": {"address": "10.0.0.1", "memory": "64GiB"},
              "cpu-02": {"address": "10.0.0.2", "memory": "64GiB"}},
    "models": {"gemma": {"source": "/models/gemma.gguf",
                         "profiles": [{"engine": "llama.cpp", "cpu": True}]},
               "qwen": {"source": "/models/qwen.gguf", "scaling": {"min": 1, "max": 1},
                        "profiles": [{"engine": "llama.cpp", "cpu": True}]}},
}


def _leaks(rendered: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if any(s[i:i + 12] in rendered for i in range(len(s) - 11))]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planted=plantings(), where=st.sampled_from(["log", "detail", "last_exit"]),
       pad=st.integers(0, 300))
def test_no_planted_secret_reaches_a_plan_or_the_fleet_snapshot(
    planted: list[tuple[str, str]], where: str, pad: int,
) -> None:
    lines = [line for line, _ in planted]
    secrets = [secret for _, secret in planted]
    cluster = cluster_from(CLUSTER)
    running: list[dict[str, Any]] = [
        {"model": "gemma", "replica": 0, "on": {"cpu-01": []}, "state": "failed",
         # `pad` moves where the 300-character cut of a quoted reason falls.
         "log_tail": ["main: loading", *(f"error: {'x' * pad} {line}" for line in lines)]
         if where == "log" else ["main: loading"],
         "detail": "x" * pad + " " + " ".join(lines) if where == "detail"
         else "exited with status 1",
         **({"last_exit": " ".join(lines), "restarts": 2} if where == "last_exit" else {}),
         "port_holder": "pid 7 (" + " ".join(lines) + ")"},
        # Started from an older cluster that had the secrets in its args and env.
        {"model": "qwen", "replica": 0, "on": {"cpu-02": []},
         "applied": {"profiles.0.args.override-kv": lines[0],
                     "profiles.0.env": {f"V{i}": line for i, line in enumerate(lines)}}},
    ]
    fleet = fleet_from(cluster, None, running, NOW)
    fleet = _with_node_errors(fleet, " ".join(lines))
    assert any(s in fleet.model_dump_json() for s in secrets)  # the fleet holds them all
    plan = plans.plan(cluster, fleet, NOW)
    rendered = {
        "text": outputs.text(plan),
        "json": outputs.json_text(plan),
        "markdown": outputs.markdown(plan),
        "markdown --engine-output": outputs.markdown(plan, engine_output=True),
        "fleet": redactions.public_json(fleet),
    }
    snapshot = Fleet.model_validate_json(rendered["fleet"])
    rendered["plan from the snapshot"] = outputs.json_text(plans.plan(cluster, snapshot, NOW))
    for name, text in rendered.items():
        assert not _leaks(text, secrets), name


def _with_node_errors(fleet: Fleet, text: str) -> Fleet:
    down = NodeReport(node="cpu-03", reachable=False, error=f"connection refused: {text}")
    nodes = dict(fleet.nodes)
    nodes["cpu-01"] = nodes["cpu-01"].model_copy(update={"fetches": [
        Fetch(kind="weights", target="org/model", state="failed", error=text)]})
    nodes["cpu-03"] = down
    return fleet.model_copy(update={"nodes": nodes})


@settings(max_examples=25, deadline=None)
@given(planted=plantings(), section=st.sampled_from(["args", "unchecked_args", "env"]))
def test_validate_refuses_every_planted_secret_and_never_echoes_it(
    planted: list[tuple[str, str]], section: str,
) -> None:
    values = {f"x-{i}" if section != "env" else f"V{i}": line
              for i, (line, _) in enumerate(planted)}
    data = {"cluster": {"name": "c"},
            "models": {"m": {"source": "/models/m.gguf",
                             "profiles": [{"engine": "llama.cpp", "cpu": True,
                                           section: values}]}}}
    with tempfile.TemporaryDirectory(prefix="llmgw-secrets-") as directory:
        (Path(directory) / "c.yaml").write_text(json.dumps(data, indent=1))
        try:
            loading.load(directory)
        except loading.SpecErrors as exc:
            errors = exc.errors
        else:
            raise AssertionError("validate accepted secrets")
    flagged = {error.message.split(":")[0].rsplit(".", 1)[-1] for error in errors
               if "secret_env" in error.message}
    assert flagged >= set(values)
    assert all(error.location is not None for error in errors)
    assert not _leaks("\n".join(str(e) for e in errors), [s for _, s in planted])
