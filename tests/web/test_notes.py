"""Notes beside /chat: private to their person, bounded, exported, deleted with the user.

A router with the pages on both stores (fixture ``store_settings``), driven over plain
HTTP by logged-in people; another person's note is attacked by posting the forms
directly, not by finding a button missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stacks import Stack
from web.test_account_keys import Person, open_stack

from llmgw.store import conversations, keys, notes, users

NOTE = re.compile(r'action="/chat/notes/([0-9a-f]{16})/delete"')


@pytest.fixture
def stack(tmp_path: Path, store_settings: dict[str, str]) -> Iterator[Stack]:
    made = open_stack(tmp_path, store_settings)
    try:
        yield made
    finally:
        made.close()


def keep(person: Person, title: str, body: str, nid: str | None = None) -> int:
    data = {"title": title, "body": body, "csrf": person.csrf}
    if nid is not None:
        data["id"] = nid
    return person.client.post(f"{person.base}/chat/notes", data=data).status_code


def page(person: Person) -> str:
    answer = person.client.get(f"{person.base}/chat/notes")
    assert answer.status_code == 200
    return answer.text


def test_a_note_is_its_persons_alone(stack: Stack) -> None:
    bob, cy, root = Person(stack, "bob"), Person(stack, "cy"), Person(stack, "root")
    try:
        assert keep(bob, "Prompts", "Ask for JSON.") == 303
        (nid,) = NOTE.findall(page(bob))
        assert "Ask for JSON." in page(bob)
        for other in (cy, root):  # an admin of llmgw included
            assert "Ask for JSON." not in page(other) and NOTE.findall(page(other)) == []
            assert other.client.get(f"{stack.url}/chat/notes?edit={nid}").status_code == 404
            assert keep(other, "mine now", "overwritten", nid) == 404
            assert other.client.post(f"{stack.url}/chat/notes/{nid}/delete",
                                     data={"csrf": other.csrf}).status_code == 404
        (kept,) = stack.run(notes.list_of(stack.db, "bob"))
        assert (kept.title, kept.body) == ("Prompts", "Ask for JSON.")
        # Its person changes and deletes it; a form without the session's token is refused.
        assert keep(bob, "Prompts", "Ask for YAML.", nid) == 303
        assert "Ask for YAML." in page(bob) and "Ask for JSON." not in page(bob)
        assert bob.client.post(f"{stack.url}/chat/notes/{nid}/delete",
                               data={"csrf": "wrong"}).status_code == 403
        assert bob.client.post(f"{stack.url}/chat/notes/{nid}/delete",
                               data={"csrf": bob.csrf}).status_code == 303
        assert stack.run(notes.list_of(stack.db, "bob")) == []
    finally:
        for person in (bob, cy, root):
            person.close()


def test_a_note_is_shown_as_text(stack: Stack) -> None:
    bob = Person(stack, "bob")
    try:
        hostile = '<script>alert(1)</script><img src=x onerror=alert(2)>"</textarea>'
        assert keep(bob, hostile, hostile) == 303
        shown = page(bob)
        assert "<script>alert(1)" not in shown and "<img src=x" not in shown
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
        (nid,) = NOTE.findall(shown)
        editing = bob.client.get(f"{stack.url}/chat/notes?edit={nid}").text
        assert "</textarea><" not in editing.split('id="note-body"', 1)[1].split("</textarea>")[0]
    finally:
        bob.close()


def test_notes_are_bounded_and_a_refused_one_keeps_what_was_typed(
    stack: Stack, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bob = Person(stack, "bob")
    try:
        answer = bob.client.post(f"{stack.url}/chat/notes", data={
            "title": "long", "body": "x" * (notes.MAX_BODY + 1), "csrf": bob.csrf})
        assert answer.status_code == 400 and f"at most {notes.MAX_BODY}" in answer.text
        assert "x" * 1000 in answer.text  # the text typed is back in the form
        monkeypatch.setattr(notes, "MAX_NOTES", 2)
        assert keep(bob, "one", "1") == 303 and keep(bob, "two", "2") == 303
        answer = bob.client.post(f"{stack.url}/chat/notes", data={
            "title": "three", "body": "the third", "csrf": bob.csrf})
        assert answer.status_code == 400 and "as many as are kept" in answer.text
        assert "the third" in answer.text
        assert [n.title for n in stack.run(notes.list_of(stack.db, "bob"))] == ["two", "one"]
    finally:
        bob.close()


def test_a_persons_data_holds_their_notes_and_goes_with_their_user(stack: Stack) -> None:
    bob = Person(stack, "bob")
    try:
        assert keep(bob, "Prompts", "Ask for JSON.") == 303
        secret = bob.create("research", "laptop")
        cid = stack.run(conversations.create(stack.db, "bob", "research", "Haiku"))
        stack.run(conversations.append(stack.db, cid, "bob", [("user", "a haiku, please")]))
        stack.run(notes.save(stack.db, "cy", "cy's", "not bob's"))
        answer = bob.client.get(f"{stack.url}/account/data")
        assert answer.status_code == 200
        assert "attachment" in answer.headers["content-disposition"]
        doc = json.loads(answer.text)
        assert doc["user"]["name"] == "bob" and doc["user"]["projects"] == ["research"]
        assert [(n["title"], n["body"]) for n in doc["notes"]] == [("Prompts", "Ask for JSON.")]
        assert [m["content"] for c in doc["conversations"] for m in c["messages"]] == [
            "a haiku, please"]
        assert [k["id"] for k in doc["keys"]] == [keys.key_id_of(secret)]
        assert secret not in answer.text and "not bob's" not in answer.text
    finally:
        bob.close()
    assert stack.run(users.delete(stack.db, "bob"))
    assert stack.run(notes.list_of(stack.db, "bob")) == []
    assert stack.run(conversations.list_for(stack.db, "bob")) == []
    assert stack.run(conversations.messages(stack.db, cid)) == []
    assert [n.body for n in stack.run(notes.list_of(stack.db, "cy"))] == ["not bob's"]
