// /chat: send the conversation to the router's /v1/chat/completions with the session
// cookie and its CSRF token, and show the answer as it streams. A user's text is inserted
// with textContent only; an answer is rendered by markdown.js, which builds DOM nodes and
// never parses text as HTML. The saved history arrives as data, in a
// <script type="application/json"> element, read through textContent and JSON.parse.
// The form is only ever sent from here (fetch, POST); a native submit is always prevented.
//
// Stop aborts the stream (the router sees the client leave and cancels the request at the
// engine); the partial answer stays, marked stopped. Regenerate asks for the last user
// message again and puts the new answer in place of the last one, in the saved
// conversation too. Copy puts a code block's text on the clipboard.
"use strict";
(function () {
  const form = document.getElementById("chat");
  if (!form) return;
  const md = window.llmgwMarkdown;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const log = document.getElementById("log");
  const status = document.getElementById("status");
  const send = document.getElementById("send");
  const stop = document.getElementById("stop");
  const regenerate = document.getElementById("regenerate");
  const message = document.getElementById("message");
  let history = [];
  try {
    history = JSON.parse(document.getElementById("history").textContent || "[]");
  } catch (e) {
    status.textContent = "the saved conversation could not be read: reload the page";
  }
  let conversation = form.dataset.conversation || "";
  let controller = null;
  // The exchange Regenerate acts on: its user text, its answer's element, whether the
  // answer is in ``history`` (not after an error: then Regenerate asks for it again), and
  // whether the saved conversation ends with it (then the new answer replaces it there).
  let last = null;

  function add(role, text) {
    const box = document.createElement("div");
    box.className = "msg " + role;
    const label = document.createElement("span");
    label.className = "role";
    label.textContent = role;
    const body = document.createElement("div");
    body.className = "text";
    if (role === "assistant") {
      body.classList.add("md");
      body.replaceChildren(md.render(text));
    } else {
      body.textContent = text;
    }
    box.append(label, body);
    log.append(box);
    return body;
  }

  // Draw the answer as it grows, but not on every chunk: at most once per twice the time
  // the last drawing took, so a long answer cannot keep the page busy re-rendering.
  function painter(out) {
    let text = "", timer = null, cost = 0;
    function draw() {
      timer = null;
      const started = performance.now();
      out.replaceChildren(md.render(text));
      cost = performance.now() - started;
    }
    return {
      set(value) {
        text = value;
        if (timer === null) timer = setTimeout(draw, Math.min(1000, Math.max(30, 2 * cost)));
      },
      done() { if (timer !== null) clearTimeout(timer); draw(); },
    };
  }

  function mark(out, how) {
    const box = out.parentElement;
    const old = box.querySelector(".note");
    if (old) old.remove();
    out.dataset.done = how;
    box.classList.toggle("stopped", how === "stopped");  // how: "yes", "stopped", "error"
    if (how === "stopped") {
      const note = document.createElement("span");
      note.className = "note";
      note.textContent = "stopped";
      box.append(note);
    }
  }

  function headers(project) {
    const h = {"Content-Type": "application/json", "X-CSRF-Token": csrf};
    if (project) h["X-Llmgw-Project"] = project;
    return h;
  }

  async function keep(project, turns, replace) {
    const path = conversation ? "/chat/conversations/" + conversation + "/messages"
                              : "/chat/conversations";
    const body = {project: project, turns: turns};
    if (replace) body.replace = true;
    const answer = await fetch(path, {method: "POST", headers: headers(project),
      credentials: "same-origin", body: JSON.stringify(body)});
    if (answer.ok) conversation = (await answer.json()).id;
    return answer.ok;
  }

  // Stream an answer to ``messages`` into ``out``: how it ended ("yes", "stopped" or
  // "error") and its text.
  async function ask(model, project, messages, out) {
    const paint = painter(out);
    out.dataset.done = "";
    out.dataset.chunks = "0";
    status.textContent = "waiting for the first token…";
    controller = new AbortController();
    let answer = "";
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(project), credentials: "same-origin",
        signal: controller.signal,
        body: JSON.stringify({model: model, messages: messages, stream: true,
                              max_tokens: parseInt(form.max_tokens.value, 10) || 256}),
      });
      if (!response.ok) {
        let why = response.status + " " + response.statusText;
        try { why = (await response.json()).error.message; } catch (e) { /* not JSON */ }
        throw new Error(why);
      }
      status.textContent = "streaming…";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {done, value} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, cut).trim();
          buffer = buffer.slice(cut + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          let chunk;
          try { chunk = JSON.parse(data); } catch (e) { continue; }
          const choice = chunk.choices && chunk.choices[0];
          const piece = choice && choice.delta && choice.delta.content;
          if (piece) {
            answer += piece;
            paint.set(answer);
            out.dataset.chunks = String(parseInt(out.dataset.chunks, 10) + 1);
          }
        }
      }
      paint.done();
      status.textContent = "done";
      mark(out, "yes");
      return {how: "yes", answer: answer};
    } catch (error) {
      paint.done();
      const stopped = error.name === "AbortError";
      status.textContent = stopped ? "stopped: the partial answer is kept"
                                   : "error: " + error.message;
      mark(out, stopped && answer ? "stopped" : "error");
      return {how: stopped && answer ? "stopped" : "error", answer: answer};
    } finally {
      controller = null;
    }
  }

  // Ask for ``text``'s answer into ``out`` and record it; ``again``: the exchange it asks
  // for anew (Regenerate), whose answer it replaces.
  async function exchange(text, out, again) {
    const model = form.model.value;
    const projectField = form.project;
    const project = projectField.value;
    const kept = projectField.selectedOptions[0] &&
                 projectField.selectedOptions[0].dataset.kept === "yes";
    const system = document.getElementById("system").value.trim();
    if (again && again.answered) history.splice(-2, 2);
    let stored = again ? again.stored : false;
    const messages = [];
    if (system) messages.push({role: "system", content: system});
    messages.push(...history.filter(function (m) { return m.role !== "system"; }));
    messages.push({role: "user", content: text});
    send.disabled = true; regenerate.disabled = true; stop.disabled = false;
    try {
      const result = await ask(model, project, messages, out);
      const answered = result.how !== "error";
      last = {text: text, out: out, answered: answered, stored: stored};
      if (!answered) return;
      history.push({role: "user", content: text}, {role: "assistant", content: result.answer});
      if (!kept) return;
      if (stored && conversation) {
        // Failed or not, the saved conversation still ends with an answer to this text.
        await keep(project, [{role: "assistant", content: result.answer}], true);
      } else {
        const turns = [{role: "user", content: text}, {role: "assistant", content: result.answer}];
        if (system && !conversation) turns.unshift({role: "system", content: system});
        stored = await keep(project, turns, false);
      }
      last.stored = stored;
    } finally {
      send.disabled = false; stop.disabled = true; regenerate.disabled = last === null;
      message.focus();
    }
  }

  // The page is drawn from the saved history: answers rendered, user text as text.
  log.replaceChildren();
  let user = null;
  for (const m of history) {
    if (m.role === "system") continue;
    const body = add(m.role, m.content);
    if (m.role === "user") user = m.content;
    else if (user !== null) last = {text: user, out: body, answered: true, stored: true};
  }
  if (history.length && history[history.length - 1].role !== "assistant") last = null;
  regenerate.disabled = last === null;

  message.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  stop.addEventListener("click", function () { if (controller) controller.abort(); });

  regenerate.addEventListener("click", function () {
    if (!last || regenerate.disabled || !form.model.value) return;
    const box = last.out.parentElement;
    const note = box.querySelector(".note");
    if (note) note.remove();
    box.classList.remove("stopped");
    exchange(last.text, last.out, last);
  });

  log.addEventListener("click", function (event) {
    const button = event.target.closest("button.copy");
    if (!button || !log.contains(button)) return;
    const code = button.closest(".codeblock").querySelector("code").textContent;
    copy(code).then(function (ok) {
      button.textContent = ok ? "Copied" : "Copy failed";
      status.textContent = ok ? "the code is on the clipboard" : "the browser refused to copy";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    });
  });

  // The clipboard API needs a secure context (https or localhost); on plain http the
  // old way, a selected off-screen textarea and the copy command, still works.
  async function copy(text) {
    if (navigator.clipboard && window.isSecureContext) {
      try { await navigator.clipboard.writeText(text); return true; } catch (e) { /* below */ }
    }
    const area = document.createElement("textarea");
    area.className = "offscreen";
    area.value = text;
    area.setAttribute("readonly", "");
    document.body.append(area);
    area.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    area.remove();
    return ok;
  }

  // Each model names the projects that may call it (data-projects, space-separated; absent:
  // any): the project field offers only those, so a chat goes under a project that allows
  // its model. The router refuses any other pairing anyway (403 model_not_allowed).
  function fitProject() {
    const chosen = form.model.selectedOptions[0];
    if (!chosen || chosen.dataset.projects === undefined) return;
    const allowed = chosen.dataset.projects.split(" ");
    let first = null;
    for (const option of form.project.options) {
      option.disabled = !allowed.includes(option.value);
      if (!option.disabled && first === null) first = option;
    }
    const current = form.project.selectedOptions[0];
    if ((!current || current.disabled) && first) form.project.value = first.value;
  }
  form.model.addEventListener("change", fitProject);
  fitProject();

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const text = message.value.trim();
    if (!text || !form.model.value || send.disabled) return;  // one exchange at a time
    add("user", text);
    const out = add("assistant", "");
    message.value = "";
    await exchange(text, out, false);
  });
})();
