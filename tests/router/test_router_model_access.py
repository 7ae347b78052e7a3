"""Model access per project (``models:``), through the router with the official openai client.

A project's keys may call only the served names its allow-list matches: 403
``model_not_allowed`` otherwise, on every endpoint that names a model, worded
the same for a model that exists and one that does not; ``GET /v1/models``
lists only what the key may call. Runs on both stores (fixture ``make_stack``).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from support.stacks import Stack, StackFactory

from llmgw.spec.models import Cluster

CPU = [{"engine": "llama.cpp", "cpu": True}]
PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}


def spec() -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {
            "llama-8b": {"profiles": CPU, "source": "/m/llama.gguf", "pricing": PRICE,
                         "adapters": [{"name": "sql-expert", "source": "/m/sql.gguf"},
                                      {"name": "pirate", "source": "/m/pirate.gguf"}]},
            "llama-70b": {"profiles": CPU, "source": "/m/llama70.gguf"},
            "coder": {"profiles": CPU, "source": "/m/coder.gguf", "served_name": "Coder-7B"},
            "embed": {"profiles": CPU, "source": "/m/embed.gguf"},
        },
        "projects": {
            # llama-* covers both llamas but no adapter: adapters match by their own name.
            "research": {"models": ["llama-*", "sql-expert", "emb?d"]},
            "interns": {"models": ["Coder-7B"]},
            "frozen": {"models": []},
            "ops": {},  # no list: every model
        },
    })


@pytest.fixture
def served(make_stack: StackFactory) -> Stack:
    stack = make_stack(spec(), replicas=4)
    small, large, coder, embed = stack.upstreams
    stack.route({"llama-8b": [small], "llama-70b": [large], "coder": [coder],
                 "embed": [embed]})
    return stack


def client(stack: Stack, project: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(project), max_retries=0)


def chat(c: openai.OpenAI, model: str) -> Any:
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])


def refused(call: Any, *args: Any, **kwargs: Any) -> None:
    """``call`` fails with the 403 ``model_not_allowed``."""
    with pytest.raises(openai.PermissionDeniedError) as caught:
        call(*args, **kwargs)
    assert caught.value.status_code == 403 and caught.value.code == "model_not_allowed"


def received(stack: Stack) -> int:
    return sum(len(u.received) for u in stack.upstreams)


def test_a_key_calls_only_what_its_project_allows(served: Stack) -> None:
    research = client(served, "research")
    for model in ("llama-8b", "llama-70b", "sql-expert"):
        assert chat(research, model).choices[0].message.content
    assert research.embeddings.create(model="embed", input="hi").data
    before = received(served)
    for model in ("Coder-7B", "pirate"):  # served here, but not research's
        with pytest.raises(openai.PermissionDeniedError) as caught:
            chat(research, model)
        assert caught.value.status_code == 403 and caught.value.code == "model_not_allowed"
        assert caught.value.body["param"] == "model"  # type: ignore[index]
    refused(research.completions.create, model="Coder-7B", prompt="hi")
    refused(research.embeddings.create, model="Coder-7B", input="hi")
    refused(research.responses.create, model="Coder-7B", input="hi")
    assert received(served) == before, "a refused request reached an engine"
    # Another project's allow-list is its own; `[]` allows nothing, no list everything.
    interns = client(served, "interns")
    assert chat(interns, "Coder-7B").choices
    refused(chat, interns, "llama-8b")
    refused(chat, client(served, "frozen"), "llama-8b")
    ops = client(served, "ops")
    assert chat(ops, "pirate").choices and chat(ops, "Coder-7B").choices
    # The usage rows say who called what; no refused request left a row.
    assert sorted({(r.project, r.model) for r in served.rows()}) == [
        ("interns", "coder"), ("ops", "coder"), ("ops", "llama-8b"),
        ("research", "embed"), ("research", "llama-70b"), ("research", "llama-8b")]


def test_a_model_that_does_not_exist_looks_like_one_not_allowed(served: Stack) -> None:
    research = client(served, "research")
    answers = []
    for model in ("Coder-7B", "no-such-model"):
        with pytest.raises(openai.PermissionDeniedError) as caught:
            chat(research, model)
        answers.append((caught.value.status_code, caught.value.body))
    (status, served_one), (status_missing, missing) = answers
    assert status == status_missing == 403
    # The same words but for the name the client sent itself.
    assert str(served_one).replace("Coder-7B", "X") == str(missing).replace("no-such-model", "X")
    # A name inside the project's own patterns that nothing serves: the usual 404.
    with pytest.raises(openai.NotFoundError) as caught:
        chat(research, "llama-405b")
    assert caught.value.code == "model_not_found"
    # A project with no list is told plainly that a model does not exist.
    with pytest.raises(openai.NotFoundError):
        chat(client(served, "ops"), "no-such-model")


def test_the_model_list_holds_only_what_the_key_may_call(served: Stack) -> None:
    def names(project: str) -> list[str]:
        return sorted(m.id for m in client(served, project).models.list())

    assert names("research") == ["embed", "llama-70b", "llama-8b", "sql-expert"]
    assert names("interns") == ["Coder-7B"]
    assert names("frozen") == []
    assert names("ops") == ["Coder-7B", "embed", "llama-70b", "llama-8b", "pirate",
                            "sql-expert"]
    research = client(served, "research")
    assert research.models.retrieve("sql-expert").id == "sql-expert"
    for hidden in ("Coder-7B", "pirate", "no-such-model"):  # alike: 404, not 403
        with pytest.raises(openai.NotFoundError):
            research.models.retrieve(hidden)


def test_a_new_allow_list_holds_from_the_next_request(served: Stack) -> None:
    interns = client(served, "interns")
    refused(chat, interns, "llama-8b")
    data = spec().model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["projects"]["interns"]["models"] = ["Coder-7B", "llama-8b"]
    from llmgw.router import catalogs

    served.call(served.router.configure, catalogs.from_cluster(Cluster.model_validate(data)))
    assert chat(interns, "llama-8b").choices
    assert sorted(m.id for m in interns.models.list()) == ["Coder-7B", "llama-8b"]
