"""/chat renders answers as markdown, safely, with Copy, Regenerate and Stop, in chromium.

A router with the pages (:class:`support.stacks.Stack`) in front of a test
upstream that streams a chosen answer (``Upstream.reply``). Before any page
script runs, an init script installs the tripwires: ``__llmgw.ran`` (hostile
payloads push to it if they ever run) and a ``securitypolicyviolation``
listener; the test also records dialogs and page errors. Nothing may trip.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.pages import shot
from support.stacks import Stack, cluster
from support.upstream import Upstream

from llmgw.router import Settings
from llmgw.spec.models import Cluster
from llmgw.store import conversations, users

TRIPWIRES = """
window.__llmgw = {ran: [], csp: []};
document.addEventListener("securitypolicyviolation", function (e) {
  window.__llmgw.csp.push(e.violatedDirective + " " + e.blockedURI);
});
"""
RAN = "__llmgw.ran.push"
HOSTILE = f"""# Report <script>{RAN}('script')</script>

<img src=x onerror="{RAN}('img')"> <iframe src="javascript:{RAN}('iframe')"></iframe>
<a href="javascript:{RAN}('a')">raw link</a> <svg onload="{RAN}('svg')"></svg>
<details open ontoggle="{RAN}('details')">x</details> <style>body{{display:none}}</style>

[click](javascript:{RAN}('md')) [upper](JaVaScRiPt:{RAN}('upper'))
[entity](jav&#x61;script:{RAN}('entity')) [data](data:text/html,<script>alert(1)</script>)
[spaced]( javascript:alert(1)) [vb](vbscript:msgbox) ![pic](javascript:alert(1))
<javascript:alert(1)> [ok](https://example.com/docs?a=1&b=2 "a title")

&lt;script&gt;alert(1)&lt;/script&gt; &#60;img src=x onerror=alert(1)&#62; &amp;lt;

***a **b *c **d *e **f _g __h ~~i `j

```html
<script>{RAN}('code')</script>
```

- item with `<b>code</b>`
- [second](mailto:ops@example.com)
"""
HOSTILE_CODE = f"<script>{RAN}('code')</script>"
SHOWCASE = """Here is **one way**, with `range` and a loop:

```python
{code}
```

1. `range(3)` counts *0, 1, 2*;
2. see [the tutorial](https://docs.python.org/3/tutorial/) for more.

| call | prints |
|---|---|
| `i = 0` | `<tab>\\t 0` |

> Raw HTML such as <b>this</b> is shown as text; long links wrap:
> https://example.com/a/long/path/that/has/no/place/to/break/at/all/on/a/phone
"""
# The attributes a rendered answer may hold, and nothing else.
ATTRIBUTES = {"class", "href", "rel", "target", "type", "aria-label", "start"}
REL = "noopener noreferrer nofollow"

# markdown -> the HTML the renderer builds (read back through innerHTML).
COPY = ('<div class="codebar"><span class="lang">{}</span><button class="copy" type="button" '
        'aria-label="Copy code">Copy</button></div>')
LINK = f'rel="{REL}" target="_blank"'
CASES = [
    ("paragraphs and breaks", "one\ntwo\n\nthree", "<p>one<br>two</p><p>three</p>"),
    ("headings", "# One\n### Three ###\n####### seven",
     "<h1>One</h1><h3>Three</h3><p>####### seven</p>"),
    ("emphasis", "**b** *i* ***bi*** __u__ _e_ ~~d~~ snake_case_name 2 * 3 * 4",
     "<p><strong>b</strong> <em>i</em> <strong><em>bi</em></strong> <strong>u</strong> "
     "<em>e</em> <del>d</del> snake_case_name 2 * 3 * 4</p>"),
    ("nested emphasis", "*a **b** c* **a *b***",
     "<p><em>a <strong>b</strong> c</em> <strong>a <em>b</em></strong></p>"),
    ("inline code keeps markup", "`**x** <b>` ``a ` b``",
     "<p><code>**x** &lt;b&gt;</code> <code>a ` b</code></p>"),
    ("escapes", r"\*not\* \[x\](y)", "<p>*not* [x](y)</p>"),
    ("fenced code", "```py\nif a < b:\n    pass\n```\nafter",
     f'<div class="codeblock">{COPY.format("py")}<pre><code>if a &lt; b:\n    pass'
     "</code></pre></div><p>after</p>"),
    ("a fence's language is text", '```<img/src=x/onerror=alert(1)> more\nx\n```',
     f'<div class="codeblock">{COPY.format("&lt;img/src=x/onerror=alert(1)&gt;")}<pre><code>x'
     "</code></pre></div>"),
    ("an unclosed fence runs to the end", "~~~\nstill code",
     f'<div class="codeblock">{COPY.format("")}<pre><code>still code</code></pre></div>'),
    ("bullet list, nested", "- a\n- b\n  - c\n- d",
     "<ul><li><p>a</p></li><li><p>b</p><ul><li><p>c</p></li></ul></li><li><p>d</p></li></ul>"),
    ("ordered list from 3", "3. x\n4. y", '<ol start="3"><li><p>x</p></li><li><p>y</p></li></ol>'),
    ("a list after a paragraph line", "Steps:\n1. go",
     "<p>Steps:</p><ol><li><p>go</p></li></ol>"),
    ("block quote, nested", "> a\n>\n> > b",
     "<blockquote><p>a</p><blockquote><p>b</p></blockquote></blockquote>"),
    ("rule", "a\n\n---\nb", "<p>a</p><hr><p>b</p>"),
    ("table", "| a | b |\n|---|--:|\n| 1 | 2 |",
     '<div class="tablewrap"><table class="md"><thead><tr><th>a</th><th class="align-right">'
     'b</th></tr></thead><tbody><tr><td>1</td><td class="align-right">2</td></tr></tbody>'
     "</table></div>"),
    ("links", "[a](https://x.example/p_(q)) <http://y.example> see https://z.example/r. "
     "[m](mailto:a@x.example)",
     f'<p><a href="https://x.example/p_(q)" {LINK}>a</a> '
     f'<a href="http://y.example/" {LINK}>http://y.example</a> see '
     f'<a href="https://z.example/r" {LINK}>https://z.example/r</a>. '
     f'<a href="mailto:a@x.example" {LINK}>m</a></p>'),
    ("links to other schemes are text", "[a](javascript:alert(1)) [b](data:x) <ftp://h/>",
     "<p>[a](javascript:alert(1)) [b](data:x) &lt;ftp://h/&gt;</p>"),
    ("raw HTML is text", '<b onclick="x()">hi</b>',
     "<p>&lt;b onclick=\"x()\"&gt;hi&lt;/b&gt;</p>"),
    ("entities", "&lt;b&gt; &amp; &#x41; &#66; &nosuch; &#0;",
     "<p>&lt;b&gt; &amp; A B &amp;nosuch; \ufffd</p>"),
]


@pytest.fixture
def md_stack(tmp_path: Path) -> Iterator[Stack]:
    data = cluster(research=None).model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["projects"] = {"notes": {"conversations": {"retention": "30d"}}}
    made = Stack(tmp_path, Cluster.model_validate(data), Settings(), 1, pages=True)
    try:
        made.route({"chat": made.upstreams})
        made.run(users.create(made.db, "cy", "cy-user-pass", projects=["notes"]))
        yield made
    finally:
        made.close()


class Chat:
    """One logged-in /chat page and what tripped on it."""

    def __init__(self, stack: Stack, browser: Any, **context: Any) -> None:
        self.stack = stack
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, **context)
        self.context.add_init_script(TRIPWIRES)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{stack.url}/login")
        self.page.fill("#name", "cy")
        self.page.fill("#password", "cy-user-pass")
        self.page.click("button[type=submit]")
        self.page.wait_for_url(re.compile(r"/chat$"))
        self.page.select_option("#model", "chat")

    @property
    def upstream(self) -> Upstream:
        return self.stack.upstreams[0]

    def answer_with(self, pieces: list[str], delays: list[float] | None = None) -> None:
        def set_reply() -> None:
            self.upstream.reply = pieces
            self.upstream.chunk_delays = delays or []
        self.stack.call(set_reply)

    def answered(self, how: str = "yes", timeout: float = 60_000) -> Any:
        """Wait until the last answer ends; it must end ``how``."""
        self.page.wait_for_function(
            "() => { const a = [...document.querySelectorAll('.msg.assistant .text')].pop();"
            " return a && a.dataset.done; }", timeout=timeout)
        last = self.page.locator(".msg.assistant .text").last
        assert last.get_attribute("data-done") == how, self.page.text_content("#status")
        return last

    def send(self, text: str, how: str = "yes") -> Any:
        self.page.fill("#message", text)
        self.page.click("#send")
        return self.answered(how)

    def tripped(self) -> dict[str, Any]:
        ran = self.page.evaluate("() => window.__llmgw")
        return {"ran": ran["ran"], "csp": ran["csp"], "dialogs": self.dialogs,
                "errors": self.errors}

    def close(self) -> None:
        self.context.close()


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def saved(stack: Stack) -> list[tuple[str, str]]:
    [conversation] = stack.run(conversations.list_for(stack.db, "cy"))
    return [(m.role, m.content) for m in stack.run(conversations.messages(stack.db,
                                                                           conversation.id))]


def test_the_renderer_builds_the_expected_markup(md_stack: Stack, browser: Any) -> None:
    chat = Chat(md_stack, browser)
    got = chat.page.evaluate(
        "cases => cases.map(t => { const d = document.createElement('div');"
        " d.append(llmgwMarkdown.render(t)); return d.innerHTML; })",
        [markdown for _, markdown, _ in CASES])
    wrong = {name: (html, want) for (name, _, want), html in zip(CASES, got, strict=True)
             if html != want}
    assert wrong == {}
    assert chat.tripped() == {"ran": [], "csp": [], "dialogs": [], "errors": []}
    chat.close()


def test_hostile_markdown_and_html_stream_in_as_text_and_nothing_runs(
    md_stack: Stack, browser: Any,
) -> None:
    chat = Chat(md_stack, browser)
    chat.answer_with(pieces(HOSTILE, 7))  # cut mid-tag, mid-link and mid-fence
    out = chat.send("Summarise the report.")
    assert int(out.get_attribute("data-chunks")) > 100, "not streamed in pieces"

    assert chat.tripped() == {"ran": [], "csp": [], "dialogs": [], "errors": []}
    shown = chat.page.evaluate("""() => {
        const a = [...document.querySelectorAll('.msg.assistant .text')].pop();
        return {
          tags: [...new Set([...a.querySelectorAll('*')].map(e => e.localName))].sort(),
          attributes: [...new Set([...a.querySelectorAll('*')].flatMap(
            e => [...e.attributes].map(x => x.name)))].sort(),
          links: [...a.querySelectorAll('a')].map(e => [e.getAttribute('href'), e.rel, e.target]),
          code: [...a.querySelectorAll('pre code')].map(e => e.textContent),
          items: a.querySelectorAll('ul > li').length,
          text: a.textContent,
        }; }""")
    assert set(shown["tags"]) <= {"h1", "p", "br", "a", "strong", "em", "del", "code", "div",
                                  "span", "button", "pre", "ul", "li"}, shown["tags"]
    assert set(shown["attributes"]) <= ATTRIBUTES, shown["attributes"]
    assert shown["links"] == [["https://example.com/docs?a=1&b=2", REL, "_blank"],
                              ["mailto:ops@example.com", REL, "_blank"]]
    assert shown["code"] == [HOSTILE_CODE]
    assert shown["items"] == 2
    for text in (f"<script>{RAN}('script')</script>", f'<img src=x onerror="{RAN}(\'img\')">',
                 "<style>body{display:none}</style>", f"[click](javascript:{RAN}('md'))",
                 "<script>alert(1)</script> <img src=x onerror=alert(1)> &lt;",
                 "<b>code</b>"):
        assert text in shown["text"], text
    # What streamed in is what the whole answer renders to at once.
    whole = chat.page.evaluate(
        "t => { const d = document.createElement('div'); d.append(llmgwMarkdown.render(t));"
        " return d.innerHTML; }", HOSTILE)
    assert out.inner_html() == whole
    # The user's own message stays plain text, markdown and all.
    assert chat.page.locator(".msg.user .text").last.inner_html() == "Summarise the report."
    chat.close()


def test_a_megabyte_of_abusive_markdown_renders_as_text_and_nothing_runs(
    md_stack: Stack, browser: Any,
) -> None:
    abuse = ["*a " * 3000, "**" * 3000, "[" * 6000 + "](", "x " + "`" * 2999 + " `` x",
             "> " * 3000 + "deep", "- " * 3000 + "deep", "_a" * 3000, "<" * 6000,
             f"<img src=x onerror=\"{RAN}('big')\">" * 100, "***a" * 1500,
             "http://" * 800, "&#x3C;" * 1000]
    body = "\n\n".join(abuse)
    answer = (body + "\n\n") * (1_000_000 // (len(body) + 2) + 1) + "THE-END"
    assert len(answer) > 1_000_000
    chat = Chat(md_stack, browser)
    chat.answer_with(pieces(answer, 4096))
    started = time.monotonic()
    out = chat.send("Go wild.")
    took = time.monotonic() - started
    assert chat.tripped() == {"ran": [], "csp": [], "dialogs": [], "errors": []}
    text = str(out.text_content())
    assert text.endswith("THE-END"), text[-200:]
    assert f"<img src=x onerror=\"{RAN}('big')\">" in text
    assert out.evaluate("a => a.querySelectorAll('img, script, iframe').length") == 0
    # Rendered as markdown all the same, and nesting stops at the renderer's cap (12).
    depth = out.evaluate("""a => { let most = 0;
        for (const e of a.querySelectorAll('blockquote, ul')) { let d = 0;
          for (let p = e; p !== a; p = p.parentElement) if (p.matches('blockquote, ul')) d++;
          most = Math.max(most, d); }
        return {most: most, strong: a.querySelectorAll('strong > em').length}; }""")
    assert depth["strong"] > 0 and depth["most"] == 12, depth
    print(f"1 MB answer: {len(answer)} characters in {len(pieces(answer, 4096))} chunks, "
          f"shown in {took:.1f} s")
    chat.close()


def test_copy_puts_a_code_block_on_the_clipboard_with_and_without_the_api(
    md_stack: Stack, browser: Any,
) -> None:
    code = ("for i in range(3):\n    print('<tab>\\t', i)  # a long line scrolls in its block, "
            "and never widens the page: " + "x" * 120)
    chat = Chat(md_stack, browser, permissions=["clipboard-read", "clipboard-write"])
    chat.answer_with(pieces(SHOWCASE.format(code=code), 5))
    chat.send("Some code please.")
    shot(chat.page, "chat-markdown.png")
    chat.page.set_viewport_size({"width": 390, "height": 900})  # a phone: nothing sticks out
    assert chat.page.evaluate("""() => [...document.querySelectorAll(
        '.msg.assistant .text, .msg.assistant .text > *')].filter(
        e => e.scrollWidth > e.clientWidth + 1 && !e.matches('.codeblock, .tablewrap'))
        .map(e => e.localName)""") == []
    assert chat.page.evaluate(
        "() => document.querySelector('.codeblock pre').scrollWidth >"
        " document.querySelector('.codeblock pre').clientWidth"), "the long code line scrolls"
    chat.page.set_viewport_size({"width": 1280, "height": 900})
    chat.page.click(".msg.assistant .codeblock button.copy")
    chat.page.wait_for_function(
        "() => document.querySelector('.codeblock button.copy').textContent === 'Copied'")
    assert chat.page.evaluate("() => navigator.clipboard.readText()") == code

    # Where the clipboard API is missing (plain http), the copy command does it.
    other = chat.context.new_page()
    other.add_init_script("Object.defineProperty(Navigator.prototype, 'clipboard', "
                          "{get: () => undefined})")
    other.goto(chat.page.url)
    other.select_option("#model", "chat")
    chat.answer_with(["```\nfallback-", "copied\n```"])
    chat.page.evaluate("() => navigator.clipboard.writeText('something else')")
    other.fill("#message", "Again.")
    other.click("#send")
    other.wait_for_function(
        "() => { const a = [...document.querySelectorAll('.msg.assistant .text')].pop();"
        " return a && a.dataset.done === 'yes'; }")
    assert other.evaluate("() => navigator.clipboard") is None
    other.locator(".msg.assistant .codeblock button.copy").last.click()
    other.wait_for_function(
        "() => [...document.querySelectorAll('.codeblock button.copy')].pop().textContent"
        " === 'Copied'")
    assert chat.page.evaluate("() => navigator.clipboard.readText()") == "fallback-copied"
    assert chat.tripped() == {"ran": [], "csp": [], "dialogs": [], "errors": []}
    chat.close()


def test_regenerate_replaces_the_last_answer_on_the_page_and_in_the_saved_conversation(
    md_stack: Stack, browser: Any,
) -> None:
    chat = Chat(md_stack, browser)
    chat.page.select_option("#project", "notes")
    chat.answer_with(["First ", "answer."])
    chat.send("Tell me something.")
    assert saved(md_stack) == [("user", "Tell me something."), ("assistant", "First answer.")]

    chat.answer_with(["**Second** ", "answer."])
    chat.page.click("#regenerate")
    out = chat.answered()
    assert out.inner_html() == "<p><strong>Second</strong> answer.</p>"
    assert chat.page.locator(".msg").count() == 2
    first, again = (r.body["messages"] for r in chat.upstream.received[-2:])
    assert first == again == [{"role": "user", "content": "Tell me something."}]
    assert saved(md_stack) == [("user", "Tell me something."),
                               ("assistant", "**Second** answer.")]

    # A reopened conversation regenerates too, and the next message carries the new answer.
    cid = md_stack.run(conversations.list_for(md_stack.db, "cy"))[0].id
    chat.page.goto(f"{md_stack.url}/chat?c={cid}")
    chat.page.select_option("#model", "chat")
    assert chat.page.locator(".msg.assistant .text strong").text_content() == "Second"
    chat.answer_with(["Third."])
    chat.page.click("#regenerate")
    chat.answered()
    chat.answer_with(["Fine."])
    chat.send("Thanks.")
    assert chat.upstream.received[-1].body["messages"] == [
        {"role": "user", "content": "Tell me something."},
        {"role": "assistant", "content": "Third."}, {"role": "user", "content": "Thanks."}]
    assert saved(md_stack) == [("user", "Tell me something."), ("assistant", "Third."),
                               ("user", "Thanks."), ("assistant", "Fine.")]
    assert chat.tripped() == {"ran": [], "csp": [], "dialogs": [], "errors": []}
    chat.close()


def test_stop_ends_a_long_stream_keeps_the_partial_answer_and_the_engine_sees_it(
    md_stack: Stack, browser: Any,
) -> None:
    chat = Chat(md_stack, browser)
    chat.page.select_option("#project", "notes")
    # Two pieces, then the engine "generates" for an hour.
    chat.answer_with(["Partial ", "*answer*", " never finished"], delays=[0, 0, 3600])
    chat.page.fill("#message", "Write a long essay.")
    chat.page.click("#send")
    chat.page.wait_for_function(
        "() => document.querySelector('.msg.assistant .text').dataset.chunks === '2'")
    assert chat.page.is_enabled("#stop") and chat.page.is_disabled("#send")
    chat.page.click("#stop")
    out = chat.answered("stopped")
    assert out.inner_html() == "<p>Partial <em>answer</em></p>"
    assert chat.page.text_content(".msg.assistant.stopped .note") == "stopped"
    assert "stopped" in str(chat.page.text_content("#status"))
    deadline = time.monotonic() + 30
    while chat.stack.call(lambda: chat.upstream.cancelled) == 0:  # the router let go of it
        assert time.monotonic() < deadline, "the engine's request was never cancelled"
        chat.page.wait_for_timeout(20)
    assert saved(md_stack) == [("user", "Write a long essay."),
                               ("assistant", "Partial *answer*")]

    # A stopped answer can be regenerated: the new one replaces it, marker and all.
    chat.answer_with(["Done."])
    chat.page.click("#regenerate")
    chat.answered()
    assert chat.page.locator(".msg.stopped, .msg .note").count() == 0
    assert saved(md_stack) == [("user", "Write a long essay."), ("assistant", "Done.")]
    assert chat.tripped() == {"ran": [], "csp": [], "dialogs": [], "errors": []}
    chat.close()


@pytest.mark.parametrize(("where", "body"), [
    pytest.param("new", {"project": "notes", "replace": True,
                         "turns": [{"role": "assistant", "content": "x"}]}, id="no-conversation"),
    pytest.param("old", {"replace": True, "turns": [{"role": "user", "content": "x"}]},
                 id="a-user-turn"),
    pytest.param("old", {"replace": True, "turns": [{"role": "assistant", "content": "x"},
                                                    {"role": "assistant", "content": "y"}]},
                 id="two-turns"),
    pytest.param("old", {"replace": "yes", "turns": [{"role": "assistant", "content": "x"}]},
                 id="not-a-boolean"),
])
def test_a_replacing_post_that_is_not_one_answer_to_an_existing_conversation_is_refused(
    md_stack: Stack, where: str, body: dict[str, Any],
) -> None:
    cid = md_stack.run(conversations.create(md_stack.db, "cy", "notes", "t", now=1.0))
    md_stack.run(conversations.append(md_stack.db, cid, "cy", [("user", "q"),
                                                               ("assistant", "a")], now=2.0))
    with httpx.Client(base_url=md_stack.url, timeout=30) as client:
        form = client.get("/login").text
        token = re.search(r'name="csrf" value="([^"]+)"', form)
        assert token
        client.post("/login", data={"name": "cy", "password": "cy-user-pass",
                                    "csrf": token.group(1)})
        csrf = re.search(r'<meta name="csrf-token" content="([^"]+)"', client.get("/chat").text)
        assert csrf
        path = "/chat/conversations" + (f"/{cid}/messages" if where == "old" else "")
        answer = client.post(path, json=body, headers={"X-CSRF-Token": csrf.group(1)})
    assert answer.status_code == 400, answer.text
    assert "replace" in answer.text
    assert [(c.title) for c in md_stack.run(conversations.list_for(md_stack.db, "cy"))] == ["t"]
    assert [m.content for m in md_stack.run(conversations.messages(md_stack.db, cid))] == [
        "q", "a"]
