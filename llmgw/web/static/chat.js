// /chat: send the conversation to the router's /v1/chat/completions with the session
// cookie and its CSRF token, and show the answer as it streams. Text is inserted with
// textContent only, never as HTML. The saved history arrives as data, in a
// <script type="application/json"> element, read through textContent and JSON.parse.
// The form is only ever sent from here (fetch, POST); a native submit is always prevented.
"use strict";
(function () {
  const form = document.getElementById("chat");
  if (!form) return;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const log = document.getElementById("log");
  const status = document.getElementById("status");
  const send = document.getElementById("send");
  const stop = document.getElementById("stop");
  const message = document.getElementById("message");
  let history = [];
  try {
    history = JSON.parse(document.getElementById("history").textContent || "[]");
  } catch (e) {
    status.textContent = "the saved conversation could not be read: reload the page";
  }
  let conversation = form.dataset.conversation || "";
  let controller = null;

  function add(role, text) {
    const box = document.createElement("div");
    box.className = "msg " + role;
    const label = document.createElement("span");
    label.className = "role";
    label.textContent = role;
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    box.append(label, body);
    log.append(box);
    return body;
  }

  function headers(project) {
    const h = {"Content-Type": "application/json", "X-CSRF-Token": csrf};
    if (project) h["X-Llmgw-Project"] = project;
    return h;
  }

  async function keep(project, turns) {
    const path = conversation ? "/chat/conversations/" + conversation + "/messages"
                              : "/chat/conversations";
    const answer = await fetch(path, {method: "POST", headers: headers(project),
      credentials: "same-origin", body: JSON.stringify({project: project, turns: turns})});
    if (answer.ok) conversation = (await answer.json()).id;
  }

  message.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  stop.addEventListener("click", function () { if (controller) controller.abort(); });

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const text = message.value.trim();
    const model = form.model.value;
    const projectField = form.project;
    const project = projectField.value;
    const kept = projectField.selectedOptions[0] &&
                 projectField.selectedOptions[0].dataset.kept === "yes";
    if (!text || !model) return;
    const system = document.getElementById("system").value.trim();
    const messages = [];
    if (system) messages.push({role: "system", content: system});
    messages.push(...history.filter(function (m) { return m.role !== "system"; }));
    messages.push({role: "user", content: text});
    add("user", text);
    const out = add("assistant", "");
    message.value = "";
    send.disabled = true; stop.disabled = false;
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
            out.textContent = answer;
            out.dataset.chunks = String((parseInt(out.dataset.chunks || "0", 10)) + 1);
          }
        }
      }
      status.textContent = "done";
      out.dataset.done = "yes";
      history.push({role: "user", content: text}, {role: "assistant", content: answer});
      if (kept) {
        const turns = [{role: "user", content: text}, {role: "assistant", content: answer}];
        if (system && !conversation) turns.unshift({role: "system", content: system});
        await keep(project, turns);
      }
    } catch (error) {
      status.textContent = error.name === "AbortError" ? "stopped" : "error: " + error.message;
      out.dataset.done = "error";
    } finally {
      send.disabled = false; stop.disabled = true; controller = null;
      message.focus();
    }
  });
})();
