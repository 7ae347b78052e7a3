"""Upstreams: OpenAI-compatible endpoints llmgw did not place, routed beside replicas.

An upstream is another llmgw, a vLLM someone runs by hand, or a provider.
Its ``models`` map a served name to the upstream's own name for it and say
how it is used: ``always`` (a replica like the others) or ``fallback``
(only when the model has no ready replica, or its replica failed before the
first byte). A served name no model declares is a model of its own, served
by upstreams alone (``always``), priced by the upstream's entry.

The key lives in a file (``api_key_file``; a relative name is in the state
directory, :mod:`llmgw.spec.statedirs`), read by the router; it is never in the cluster
files, the plan, the published routes, the pages or the metrics.

``problems(cluster)`` is a purely computational check of references;
``file_problems(cluster)`` looks at the key files (after the loader made
their paths absolute).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from llmgw.spec import identifiers
from llmgw.spec.bases import Strict
from llmgw.spec.identifiers import ServedName
from llmgw.spec.quantities import Duration
from llmgw.spec.servings import Pricing

if TYPE_CHECKING:
    from llmgw.spec.models import Cluster

PathT = tuple[str | int, ...]
MAX_KEY_BYTES = 8192  # a key file longer than this is not a key


class UpstreamModel(Strict):
    model: ServedName | None = Field(
        None, description="The upstream's name for the model, sent as the request's "
        "`model`; default: the served name.",
    )
    use: Literal["always", "fallback"] = Field(
        "fallback",
        description="`always`: routed like a replica of the model. `fallback`: only while "
        "the model has no ready replica (none placed yet, all stopped), or for the retry "
        "of a request whose replica failed before its first byte.",
    )
    pricing: Pricing | None = Field(
        None, description="Prices of a served name no model declares (served by upstreams "
        "alone); a declared model's requests pay the model's `pricing` wherever they go.",
    )


class HealthCheck(Strict):
    path: Literal["/v1/models", "/health"] = Field(
        "/v1/models", description="What the router asks (GET, with the key): a 2xx is up.",
    )
    interval: Duration = Field(10.0, gt=0, description="Between two probes of an upstream "
                               "that is up.")
    timeout: Duration = Field(5.0, gt=0, description="A probe without an answer by then "
                              "failed.")
    max_backoff: Duration = Field(
        60.0, gt=0, description="While it is down, probes come 1 s, 2 s, 4 s … apart, "
        "never further apart than this.",
    )


class Upstream(Strict):
    url: str = Field(
        description="Base URL the `/v1/...` paths are appended to: `https://host[:port][/prefix]`"
        " (no user, query or fragment).",
    )
    api_key_file: str | None = Field(
        None, description="File holding the key sent as `Authorization: Bearer …` (mode 0600,"
        " kept out of git): a relative name is in the control host's state directory "
        "(`cluster.state_dir`), or, when only there, the cluster directory, which `validate` "
        "warns about. Absent: no key is sent. The client's own key is never forwarded.",
    )
    models: dict[ServedName, UpstreamModel] = Field(
        min_length=1, description="Served name → how this upstream serves it.",
    )
    max_in_flight: int | None = Field(
        None, ge=1, le=100_000, description="Most requests this router sends it at once; "
        "unset: no cap (a model's `routing.max_in_flight` is about its engines).",
    )
    health: HealthCheck = Field(default_factory=HealthCheck, description="The probe; an "
                                "upstream that is down is not routed.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        check_url(value)
        return value.rstrip("/")


def check_url(text: str) -> None:
    """An http(s) URL of a host and a plain path, or ValueError saying what is wrong."""
    shown = identifiers.show(text)
    if not identifiers.HTTP_URL.match(text):
        raise ValueError(f"invalid upstream url {shown}: use http(s)://host[:port][/path] with "
                         "letters, digits and '._~/-' in the path (no user, query or fragment)")
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"invalid upstream url {shown}: the port is not a number from "
                         "1 to 65535") from None
    host = parts.hostname or ""
    if port == 0 or not host or not identifiers.is_address(host.strip("[]")) or host == "local":
        raise ValueError(f"invalid upstream url {shown}: no valid host "
                         f"({identifiers.ADDRESS_RULE})")


def served_by_upstreams(cluster: Cluster) -> dict[str, str]:
    """Served names no model declares → the first upstream (by name) serving them."""
    declared = {model.served_name or key for key, model in cluster.models.items()}
    found: dict[str, str] = {}
    for name, upstream in sorted(cluster.upstreams.items()):
        for served in upstream.models:
            if served not in declared:
                found.setdefault(served, name)
    return found


def problems(cluster: Cluster) -> Iterator[tuple[PathT, str]]:
    """References between upstreams and models. A purely computational function."""
    declared = {model.served_name or key for key, model in cluster.models.items()}
    adapters = {a.name for model in cluster.models.values() for a in model.adapters}
    urls: dict[str, str] = {}
    for name, upstream in sorted(cluster.upstreams.items()):
        first = urls.setdefault(upstream.url, name)
        if first != name:
            # The router knows an endpoint by its URL: two would share one key and cap.
            yield ("upstreams", name, "url"), (
                f"upstreams.{name}.url: {upstream.url} is upstream {first}'s too; one "
                "upstream per URL (list every model it serves under one name)")
        for served, entry in upstream.models.items():
            base: PathT = ("upstreams", name, "models", served)
            where = f"upstreams.{name}.models.{served}"
            if served in adapters:
                yield base, (f"{where}: {served!r} is a LoRA adapter; an upstream serves a "
                             "model, not one replica's adapter")
            elif served in declared:
                if entry.pricing is not None:
                    yield (*base, "pricing"), (f"{where}: a declared model's requests pay its "
                                               "own `pricing`; remove this one")
            else:
                if served in cluster.models:
                    yield base, (f"{where}: {served!r} is the key of a model with another "
                                 "served name; name the model by its served name")
                elif entry.use == "fallback":
                    yield (*base, "use"), (
                        f"{where}: `fallback` to what? No model serves {served!r} (known: "
                        f"{', '.join(sorted(declared)) or 'none'}); a name only upstreams "
                        "serve takes `use: always`")


def file_problems(cluster: Cluster) -> Iterator[tuple[PathT, str]]:
    """Key files that are missing, unreadable, not regular files, empty or too large.

    Reads the files (the loader calls this after making their paths absolute); a
    message never quotes a file's content."""
    for name, upstream in sorted(cluster.upstreams.items()):
        if upstream.api_key_file is None:
            continue
        path = Path(upstream.api_key_file)
        where = f"upstreams.{name}.api_key_file"
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode):
                yield (("upstreams", name, "api_key_file"),
                       f"{where}: {path} is not a regular file")
                continue
            key = read_key(path)
        except FileNotFoundError:
            yield (("upstreams", name, "api_key_file"), f"{where}: {path} does not exist")
            continue
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            yield (("upstreams", name, "api_key_file"), f"{where}: cannot read {path}: {reason}")
            continue
        if not key:
            yield (("upstreams", name, "api_key_file"), f"{where}: {path} is empty")


def read_key(path: str | Path) -> str:
    """The key in ``path``, its surrounding whitespace stripped; ValueError when it cannot
    be one (too long, not text, a line break or control character inside)."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_KEY_BYTES + 1)
    if len(data) > MAX_KEY_BYTES:
        raise ValueError(f"longer than {MAX_KEY_BYTES} bytes: not a key")
    try:
        key = data.decode().strip()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if any(ord(char) < 0x21 or ord(char) == 0x7F for char in key):
        # It goes into an HTTP header: a line break would add headers of its own.
        raise ValueError("holds a space, line break or control character")
    return key



def summary(cluster: Cluster) -> dict[str, dict[str, object]]:
    """Each upstream as a plan compares it and the leader publishes it: never the key,
    nor its file's path (only whether there is one). A purely computational function."""
    return {
        name: {
            "url": upstream.url,
            "key": upstream.api_key_file is not None,
            "models": {served: [entry.model or served, entry.use]
                       for served, entry in sorted(upstream.models.items())},
            "max_in_flight": upstream.max_in_flight,
        }
        for name, upstream in sorted(cluster.upstreams.items())
    }
