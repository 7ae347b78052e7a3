"""LoRA adapters through the router: listed, routed to their base's replicas, rewritten as
each engine selects an adapter, billed at their own price or their base's.

Real HTTP upstreams (support.upstream) record what reached them; the official
openai client asks. The real llama-server serving a real adapter is
tests/e2e/test_real_lora.py.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from support.stacks import Stack, StackFactory

from llmgw.spec.models import Cluster

CPU = [{"engine": "llama.cpp", "cpu": True}]
GPU = {"gpu_class": "h100-80g"}
BASE_PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
SQL_PRICE = {"input_per_mtok": 10.0, "output_per_mtok": 30.0}


def spec() -> Cluster:
    return Cluster.model_validate({
        "cluster": {"name": "lab"},
        "models": {
            "gemma": {"profiles": CPU, "source": "/m/gemma.gguf", "pricing": BASE_PRICE,
                      "adapters": [
                          {"name": "gemma-pirate", "source": "/m/pirate.gguf", "scale": 2},
                          {"name": "gemma-sql", "source": "/m/sql.gguf", "pricing": SQL_PRICE},
                      ]},
            "qwen": {"profiles": [{"engine": "vllm", **GPU}], "served_name": "Qwen-7B",
                     "pricing": BASE_PRICE,
                     "adapters": [{"name": "qwen-sql", "source": "/m/qwen-sql",
                                   "pricing": SQL_PRICE}]},
            "llama": {"profiles": [{"engine": "sglang", **GPU}],
                      "adapters": [{"name": "llama-sql", "source": "/m/llama-sql"}]},
            "plain": {"profiles": CPU, "source": "/m/plain.gguf"},
        },
        "projects": {"research": {}},
    })


@pytest.fixture
def served(make_stack: StackFactory) -> Stack:
    stack = make_stack(spec(), replicas=4)
    gemma, qwen, llama, plain = stack.upstreams
    stack.route({"gemma": [gemma], "qwen": [qwen], "llama": [llama], "plain": [plain]})
    return stack


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key(), max_retries=0)


def ask(stack: Stack, model: str, **extra: Any) -> dict[str, Any]:
    """Send one completion for ``model``; the body its engine received."""
    before = sum(len(u.received) for u in stack.upstreams)
    client(stack).completions.create(model=model, prompt="SELECT", max_tokens=3,
                                     extra_body=extra or None)
    (received,) = [r for u in stack.upstreams for r in u.received][before:] or [None]
    assert received is not None
    return received.body


def test_models_lists_each_adapter_under_its_base(served: Stack) -> None:
    listed = {m.id: m.model_dump() for m in client(served).models.list().data}
    assert sorted(listed) == ["Qwen-7B", "gemma", "gemma-pirate", "gemma-sql", "llama",
                              "llama-sql", "plain", "qwen-sql"]
    assert {name: (card.get("parent"), card.get("root")) for name, card in listed.items()
            if card.get("parent")} == {
        "gemma-pirate": ("gemma", "gemma"), "gemma-sql": ("gemma", "gemma"),
        "qwen-sql": ("Qwen-7B", "Qwen-7B"), "llama-sql": ("llama", "llama")}
    card = client(served).models.retrieve("qwen-sql").model_dump()
    assert card["parent"] == "Qwen-7B"


def test_an_adapter_without_a_ready_base_is_not_listed(make_stack: StackFactory) -> None:
    stack = make_stack(spec(), replicas=1)
    stack.route({"plain": stack.upstreams})
    assert [m.id for m in client(stack).models.list().data] == ["plain"]


def test_llama_cpp_gets_the_base_name_and_every_adapter_scaled(served: Stack) -> None:
    gemma = served.upstreams[0]
    body = ask(served, "gemma-pirate")
    assert (body["model"], body["lora"]) == ("gemma", [{"id": 0, "scale": 2.0},
                                                       {"id": 1, "scale": 0.0}])
    body = ask(served, "gemma-sql")
    assert (body["model"], body["lora"]) == ("gemma", [{"id": 0, "scale": 0.0},
                                                       {"id": 1, "scale": 1.0}])
    # The base: every adapter off, since llama-server applies them to a request naming none.
    body = ask(served, "gemma")
    assert (body["model"], body["lora"]) == ("gemma", [{"id": 0, "scale": 0.0},
                                                       {"id": 1, "scale": 0.0}])
    assert len(gemma.received) == 3


def test_vllm_gets_the_adapter_name_as_it_is(served: Stack) -> None:
    body = ask(served, "qwen-sql")
    assert body["model"] == "qwen-sql" and "lora" not in body
    assert served.upstreams[1].received


def test_sglang_gets_base_colon_adapter(served: Stack) -> None:
    assert ask(served, "llama-sql")["model"] == "llama:llama-sql"


def test_a_model_without_adapters_is_sent_as_it_came(served: Stack) -> None:
    body = ask(served, "plain", lora=[{"id": 0, "scale": 1}])
    assert body["model"] == "plain" and body["lora"] == [{"id": 0, "scale": 1}]


def test_a_base_request_naming_adapters_itself_is_refused(served: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        ask(served, "gemma", lora=[{"id": 1, "scale": 1}])
    assert raised.value.body["param"] == "lora"  # type: ignore[index]
    assert not served.upstreams[0].received


@pytest.mark.parametrize(("model", "price"), [
    pytest.param("gemma-sql", SQL_PRICE, id="its own price"),
    pytest.param("gemma-pirate", BASE_PRICE, id="the base's price"),
    pytest.param("qwen-sql", SQL_PRICE, id="its own price, vLLM"),
    pytest.param("gemma", BASE_PRICE, id="the base itself"),
])
def test_an_adapter_is_billed_at_its_price_or_else_its_base(
        served: Stack, model: str, price: dict[str, float]) -> None:
    ask(served, model)
    (row,) = served.rows()
    assert row.model == {"gemma-sql": "gemma", "gemma-pirate": "gemma", "qwen-sql": "qwen",
                         "gemma": "gemma"}[model]
    assert row.prompt_tokens and row.completion_tokens
    assert row.cost_usd == pytest.approx((row.prompt_tokens * price["input_per_mtok"]
                                          + row.completion_tokens * price["output_per_mtok"])
                                         / 1_000_000)


def test_an_unknown_name_is_still_model_not_found(served: Stack) -> None:
    with pytest.raises(openai.NotFoundError):
        ask(served, "gemma-nonesuch")
