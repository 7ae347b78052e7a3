"""Desired state of the people side: projects (budgets, limits, model access, kept
conversations) and the pages' settings (single sign-on, the audit log).

Part of the cluster's pydantic types (:mod:`llmgw.spec.models` re-exports them, and
its ``Cluster`` holds them); every field carries a description, from which
``docs/cluster-reference.md`` is generated. Shape only: whether a project's
references resolve is :mod:`llmgw.spec.checks`.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator, model_validator

from llmgw.spec import identifiers
from llmgw.spec.bases import Strict
from llmgw.spec.budgets import LIFETIME, Budget, Period
from llmgw.spec.identifiers import (
    ModelPattern,
    Name,
)
from llmgw.spec.quantities import Duration


class OidcGroup(Strict):
    projects: list[Name] = Field(
        default_factory=list, description="Projects a member of this group belongs to."
    )
    admin: bool = Field(False, description="Members of this group are admins (/admin).")
    admin_of: list[Name] = Field(
        default_factory=list,
        description="Projects a member of this group is a project admin of (on /account they "
        "see and revoke every key of the project); each is joined too.",
    )


def _issuer(value: str) -> str:
    """An https URL; plain http only on a loopback host (a lab, a test)."""
    parts = urlsplit(value)
    loopback = parts.hostname in ("127.0.0.1", "::1", "localhost")
    if not (parts.scheme == "https" or (parts.scheme == "http" and loopback)) or \
            not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"expected the provider's https URL, such as "
                         f"https://idp.example.com/realms/corp (http only on 127.0.0.1); "
                         f"got {value!r}")
    return value  # as is: the ID token's `iss` must equal it exactly


class OidcSettings(Strict):
    issuer: Annotated[str, AfterValidator(_issuer)] = Field(
        description="The OpenID provider's issuer URL; its discovery document is read from "
        "`{issuer}/.well-known/openid-configuration`, and ID tokens must name it as `iss`."
    )
    client_id: str = Field(min_length=1, max_length=256,
                           description="llmgw's client id at the provider.")
    client_secret_file: str | None = Field(
        None,
        description="Absolute path of a file holding the client secret (read at each login, "
        "never logged). Absent: a public client, protected by PKCE alone.",
    )
    groups_claim: str = Field(
        "groups", min_length=1, max_length=128,
        description="The claim (ID token, else userinfo) that lists the person's groups.",
    )
    username_claim: str = Field(
        "preferred_username", min_length=1, max_length=128,
        description="The claim that names the llmgw user (lowercased; characters a user "
        "name cannot have become `-`); `sub` when the claim is absent.",
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["openid", "profile", "email"],
        description="Scopes asked for; `openid` is always added. Add your provider's groups "
        "scope where it has one.",
    )
    groups: dict[str, OidcGroup] = Field(
        default_factory=dict,
        description="What each of the provider's groups grants, re-read at every login. A "
        "person in none of these groups cannot sign in.",
    )
    redirect_uri: str | None = Field(
        None,
        description="The callback registered at the provider; default: "
        "`<this router's URL>/login/oidc/callback` as the browser reached it.",
    )
    display_name: str = Field("single sign-on", max_length=64,
                              description="What the login page's button says after `Sign in "
                              "with`.")

    @field_validator("client_secret_file")
    @classmethod
    def _secret_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"client_secret_file must be an absolute path to a file, not the "
                             f"secret itself; got a value of {len(value)} characters")
        return value

    @field_validator("redirect_uri")
    @classmethod
    def _redirect(cls, value: str | None) -> str | None:
        if value is not None and not identifiers.HTTP_URL.match(value):
            raise ValueError(f"expected an http(s) URL ending in /login/oidc/callback; got "
                             f"{value!r}")
        return value

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: dict[str, OidcGroup]) -> dict[str, OidcGroup]:
        for name in value:
            if not name or len(name) > 256 or not name.isprintable():
                raise ValueError(f"a group name is 1 to 256 printable characters; got {name!r}")
        return value


class WebSettings(Strict):
    session_ttl: Duration = Field(
        43200.0, description="A login lasts this long (absolute, from the moment of login)."
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses of reverse proxies (nginx, Caddy) whose X-Forwarded-Proto and "
        "X-Forwarded-For are believed: behind TLS there, session cookies are marked Secure.",
    )
    secure_cookies: bool = Field(
        False, description="Mark session cookies Secure even without a trusted proxy's word."
    )
    local_logins: bool = Field(
        True,
        description="Whether users log in with a local password (`llmgw users`). `false` "
        "with `oidc`: only single sign-on.",
    )
    oidc: OidcSettings | None = Field(
        None,
        description="Single sign-on through an OpenID Connect provider (authorization code "
        "flow with PKCE). See docs/web.md.",
    )

    @model_validator(mode="after")
    def _someone_logs_in(self) -> WebSettings:
        if not self.local_logins and self.oidc is None:
            raise ValueError("local_logins: false needs oidc: nobody could log in")
        return self

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"expected an IP address or network such as 127.0.0.1 or "
                                 f"10.0.0.0/8; got {item!r}") from None
        return value


class AuditSettings(Strict):
    retention: Duration = Field(
        365 * 86400.0,
        description="How long the audit log keeps an entry (`llmgw audit`); the daemon "
        "deletes older ones. Default a year.",
    )

    @field_validator("retention")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("retention must be longer than zero (for example 365d)")
        return value


class Conversations(Strict):
    retention: Duration = Field(
        description="How long /chat keeps a conversation after its last message; the daemon "
        "deletes older ones. Required: conversations are never kept without a limit.",
    )

    @field_validator("retention")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("retention must be longer than zero (for example 30d)")
        return value


class Project(Strict):
    conversations: Conversations | None = Field(
        None,
        description="Keep /chat conversations of this project's members, for `retention`. "
        "Absent (the default): no prompt or answer text is stored anywhere.",
    )
    budget_usd: float | None = Field(
        None, ge=0, description="Lifetime spend limit in USD; requests past it get 429. "
        "None: unlimited. The short form of `budget: {usd: ..., period: none}`."
    )
    budget: Budget | None = Field(
        None, description="Spend limit per calendar period (`{usd: 100, period: month, "
        "timezone: Europe/Paris}`); not with `budget_usd`. None: `budget_usd`.",
    )
    max_request_usd: float | None = Field(
        None, gt=0, le=1_000_000,
        description="The most one request may reserve, in USD: a request whose estimate "
        "(its prompt's bytes as tokens plus max_tokens × n, each capped by the model's "
        "context length, at its prices) is above it gets 400. None: no cap beyond the "
        "context length.",
    )
    rpm: int | None = Field(
        None, ge=1, le=1_000_000_000,
        description="Requests per minute for the whole project, across every router sharing "
        "the store; a request past it gets 429 `rate_limit_exceeded` with `Retry-After`. "
        "A key's own `--rpm` applies as well. None: no limit.",
    )
    tpm: int | None = Field(
        None, ge=1, le=1_000_000_000_000,
        description="Tokens per minute for the whole project: a request is admitted with its "
        "estimate (its prompt's bytes as tokens plus max_tokens × n) and corrected to the "
        "engine's usage when it ends; one whose estimate does not fit the minute gets 429. "
        "A key's own `--tpm` applies as well. None: no limit.",
    )
    description: str = Field("", description="Free text for people.")
    models: list[ModelPattern] | None = Field(
        None,
        description="The served names (models and LoRA adapters) this project's keys and "
        "members may call, each a name or a glob (`*` any run of characters, `?` one): "
        "`[llama-*, sql-expert]`. Anything else gets 403 `model_not_allowed`, and "
        "`/v1/models` and /chat list only these. An adapter is matched by its own name, not "
        "its base model's. Each pattern must match a model or adapter of the cluster. "
        "Absent (the default): every model; `[]`: none.",
    )

    @model_validator(mode="after")
    def _one_budget(self) -> Project:
        if self.budget is not None and self.budget_usd is not None:
            raise ValueError("give `budget_usd` or `budget`, not both: `budget_usd: N` is "
                             "`budget: {usd: N, period: none}`")
        return self

    def limit(self) -> tuple[float | None, Period]:
        """The budget in USD (None: unlimited) and the period it resets on."""
        if self.budget is not None:
            return self.budget.usd, Period(self.budget.period, self.budget.timezone)
        return self.budget_usd, LIFETIME
