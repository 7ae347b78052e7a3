// markdown.js: an answer's markdown as DOM nodes, safe by construction.
//
// llmgwMarkdown.render(text) returns a DocumentFragment built with createElement and
// text nodes only: no string is ever parsed as HTML (no innerHTML, insertAdjacentHTML
// or document.write), so HTML in an answer is shown as the text it is. Links keep only
// http:, https: and mailto: URLs and open with rel="noopener noreferrer nofollow".
//
// It knows what models write: paragraphs, ATX headings, emphasis (* _ ** __ ***),
// ~~strikethrough~~, `code`, fenced code blocks (with a Copy button chat.js handles),
// bullet and ordered lists (nested), block quotes, rules, pipe tables, [links](url),
// <autolinks>, bare http(s) URLs, backslash escapes and the common character entities.
//
// Work stays linear in the text, whatever it holds: no regular expression here can
// backtrack over a line (each is anchored with bounded repeats, or scans one class);
// nesting stops at MAX_DEPTH; a search for a closing delimiter that failed is never
// repeated over the same range; and when the searches of one render have scanned
// SEARCH_BUDGET times the text's length, the rest is shown as plain text.
"use strict";
(function () {
  const MAX_DEPTH = 12;
  const SEARCH_BUDGET = 8;
  const MAX_COLUMNS = 64;
  const MAX_URL = 4096;
  const PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  const ENTITIES = {amp: "&", lt: "<", gt: ">", quot: "\"", apos: "'", nbsp: "\u00a0",
                    copy: "\u00a9", reg: "\u00ae", trade: "\u2122", hellip: "\u2026",
                    mdash: "\u2014", ndash: "\u2013", laquo: "\u00ab", raquo: "\u00bb",
                    times: "\u00d7", deg: "\u00b0", euro: "\u20ac"};
  const ENTITY = /&(?:#[xX]([0-9a-fA-F]{1,6})|#([0-9]{1,7})|([A-Za-z][A-Za-z0-9]{1,31}));/y;
  const FENCE = /^ {0,3}(`{3,}|~{3,})/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]|$)/;
  const LIST = /^([ \t]{0,12})([-*+]|[0-9]{1,9}[.)])(?:[ \t]+|$)/;
  const QUOTE = /^ {0,3}> ?/;
  const SCHEME = /^(?:https?:\/\/|mailto:)/i;
  const ALNUM = /[\p{L}\p{N}]/u;

  function el(tag, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    return node;
  }

  function blank(line) { return line.trim() === ""; }

  function indent(line) {
    let columns = 0;
    for (const c of line) {
      if (c === " ") columns += 1;
      else if (c === "\t") columns += 4 - (columns % 4);
      else break;
    }
    return columns;
  }

  function dedent(line, columns) {
    let i = 0, taken = 0;
    while (i < line.length && taken < columns && (line[i] === " " || line[i] === "\t")) {
      taken += line[i] === "\t" ? 4 - (taken % 4) : 1;
      i += 1;
    }
    return line.slice(i);
  }

  function isRule(line) {
    if (indent(line) > 3) return false;
    const squeezed = line.replace(/[ \t]+/g, "");
    return /^(?:-{3,}|\*{3,}|_{3,})$/.test(squeezed);
  }

  function fence(line) {
    const m = FENCE.exec(line);
    if (!m) return null;
    const info = line.slice(m[0].length).trim();
    if (m[1][0] === "`" && info.includes("`")) return null;
    return {char: m[1][0], size: m[1].length, indent: indent(line),
            lang: info.split(/\s/, 1)[0].slice(0, 40)};
  }

  function closes(line, open) {
    const m = FENCE.exec(line);
    return !!m && m[1][0] === open.char && m[1].length >= open.size &&
           line.slice(m[0].length).trim() === "";
  }

  function cells(line) {
    let t = line.trim();
    if (t.startsWith("|")) t = t.slice(1);
    if (t.endsWith("|") && !t.endsWith("\\|")) t = t.slice(0, -1);
    return t.split(/(?<!\\)\|/).map(function (c) { return c.trim(); });
  }

  function delimiterRow(line) {
    if (!line || !line.includes("-") || !/^[ \t|:-]+$/.test(line)) return null;
    const row = cells(line);
    if (row.length > MAX_COLUMNS || !row.every(function (c) { return /^:?-+:?$/.test(c); })) {
      return null;
    }
    return row.map(function (c) {
      if (c.startsWith(":") && c.endsWith(":")) return "center";
      return c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "";
    });
  }

  function tableStarts(lines, i) {
    const line = lines[i];
    const aligns = line.includes("|") && indent(line) <= 3 ? delimiterRow(lines[i + 1]) : null;
    return aligns && cells(line).length === aligns.length ? aligns : null;
  }

  // -- blocks ----------------------------------------------------------------------------

  function interrupts(lines, i, depth) {
    const line = lines[i];
    if (fence(line) || HEADING.test(line) || isRule(line) || QUOTE.test(line)) return true;
    const m = depth < MAX_DEPTH && LIST.exec(line);
    // As in CommonMark, only a list that starts at 1 (or a bullet) ends a paragraph, so a
    // sentence ending in "in 2024. It" followed by a line does not become a list.
    return (m && indent(line) <= 3 && line.slice(m[0].length).trim() !== "" &&
            (/^[-*+]$/.test(m[2]) || /^1[.)]$/.test(m[2]))) || !!tableStarts(lines, i);
  }

  function blocks(lines, parent, depth, ctx) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (blank(line)) { i += 1; continue; }
      const open = fence(line);
      if (open) { i = codeBlock(lines, i, open, parent); continue; }
      if (depth < MAX_DEPTH && QUOTE.test(line)) { i = quote(lines, i, parent, depth, ctx); continue; }
      if ((m = HEADING.exec(line))) { heading(line, m, parent, ctx); i += 1; continue; }
      if (isRule(line)) { parent.append(el("hr")); i += 1; continue; }
      if (depth < MAX_DEPTH && indent(line) <= 3 && LIST.test(line)) {
        i = list(lines, i, parent, depth, ctx);
        continue;
      }
      const aligns = tableStarts(lines, i);
      if (aligns) { i = table(lines, i, aligns, parent, ctx); continue; }
      i = paragraph(lines, i, parent, depth, ctx);
    }
  }

  function codeBlock(lines, i, open, parent) {
    const body = [];
    let j = i + 1;
    while (j < lines.length && !closes(lines[j], open)) {
      body.push(dedent(lines[j], open.indent));
      j += 1;
    }
    const box = el("div", "codeblock");
    const bar = el("div", "codebar");
    const lang = el("span", "lang");
    lang.textContent = open.lang;
    const copy = el("button", "copy");
    copy.type = "button";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", "Copy code");
    bar.append(lang, copy);
    const pre = el("pre");
    const code = el("code");
    code.textContent = body.join("\n");
    pre.append(code);
    box.append(bar, pre);
    parent.append(box);
    return j + 1;  // past the closing fence; while an answer streams there may be none yet
  }

  function quote(lines, i, parent, depth, ctx) {
    const inner = [];
    let m;
    while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
      inner.push(lines[i].slice(m[0].length));
      i += 1;
    }
    const box = el("blockquote");
    blocks(inner, box, depth + 1, ctx);
    parent.append(box);
    return i;
  }

  function heading(line, m, parent, ctx) {
    let text = line.slice(m[0].length).trimEnd();
    let cut = text.length;
    while (cut > 0 && text[cut - 1] === "#") cut -= 1;
    if (cut === 0 || text[cut - 1] === " " || text[cut - 1] === "\t") text = text.slice(0, cut);
    const node = el("h" + m[1].length);
    inline(text.trim(), node, ctx);
    parent.append(node);
  }

  function list(lines, i, parent, depth, ctx) {
    const first = LIST.exec(lines[i]);
    const ordered = /[0-9]/.test(first[2]);
    const kind = ordered ? first[2].slice(-1) : first[2];  // 1. and 1) are two lists, - and *
    const box = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) box.start = parseInt(first[2], 10);
    const base = indent(lines[i]);
    const items = [];
    let gap = false;
    while (i < lines.length) {
      const line = lines[i];
      if (blank(line)) {
        gap = true;
        items[items.length - 1].lines.push("");
        i += 1;
        continue;
      }
      const m = LIST.exec(line);
      const at = indent(line);
      if (m && at <= base + 1 && /[0-9]/.test(m[2]) === ordered &&
          (ordered ? m[2].slice(-1) : m[2]) === kind) {  // the next item
        const rest = line.slice(m[0].length);
        items.push({lines: [rest], width: rest.trim() ? indent(line) + m[0].length - m[1].length
                                                       : at + m[2].length + 1});
        gap = false;
      } else if (at > base) {  // indented under the item: its text, a nested list, code
        const item = items[items.length - 1];
        item.lines.push(dedent(line, Math.min(at, item.width)));
        gap = false;
      } else if (!gap && !interrupts(lines, i, depth)) {  // a lazy line of its paragraph
        items[items.length - 1].lines.push(line);
      } else {
        break;
      }
      i += 1;
    }
    for (const item of items) {
      const li = el("li");
      blocks(item.lines, li, depth + 1, ctx);
      box.append(li);
    }
    parent.append(box);
    return i;
  }

  function table(lines, i, aligns, parent, ctx) {
    const wrap = el("div", "tablewrap");
    const t = el("table", "md");
    const head = el("thead");
    const body = el("tbody");
    function row(line, tag, into) {
      const tr = el("tr");
      const values = cells(line);
      aligns.forEach(function (align, k) {
        const cell = el(tag);
        if (align) cell.className = "align-" + align;
        inline((values[k] || "").replace(/\\\|/g, "|"), cell, ctx);
        tr.append(cell);
      });
      into.append(tr);
    }
    row(lines[i], "th", head);
    i += 2;
    while (i < lines.length && !blank(lines[i]) && lines[i].includes("|")) {
      row(lines[i], "td", body);
      i += 1;
    }
    t.append(head, body);
    wrap.append(t);
    parent.append(wrap);
    return i;
  }

  function paragraph(lines, i, parent, depth, ctx) {
    const text = [lines[i].trim()];
    i += 1;
    while (i < lines.length && !blank(lines[i]) && !interrupts(lines, i, depth)) {
      text.push(lines[i].trim());
      i += 1;
    }
    const p = el("p");
    inline(text.join("\n"), p, ctx);
    parent.append(p);
    return i;
  }

  // -- inline ----------------------------------------------------------------------------

  function safeUrl(raw) {
    if (raw.length > MAX_URL || !SCHEME.test(raw)) return null;
    let url;
    try { url = new URL(raw); } catch (e) { return null; }
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  }

  function link(href, into) {
    const a = el("a");
    a.href = href;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    into.append(a);
    return a;
  }

  function inline(s, parent, ctx) {
    span(s, 0, s.length, parent, 0, false, ctx);
  }

  // A run of ``c`` starting at i: how long.
  function run(s, i, c) {
    let j = i;
    while (j < s.length && s[j] === c) j += 1;
    return j - i;
  }

  function space(c) { return c === undefined || /\s/.test(c); }

  function span(s, start, end, parent, depth, inLink, ctx) {
    const failed = Object.create(null);  // what was searched for, and from where, in vain
    let lit = start, i = start;
    let bracket = -2;  // where the next ] is, once searched for; -1: there is none left
    function flush(to) { if (to > lit) parent.append(s.slice(lit, to)); }
    function budget(scanned) { ctx.work += scanned; return ctx.work <= ctx.limit; }
    // The start of a closing run of n ``c`` in [from, end): a run of exactly n (or of 3,
    // which closes ** and * as well) after a non-space; -1 when there is none.
    function closer(c, n, from) {
      const key = c + n;
      if (key in failed && failed[key] <= from) return -1;
      let pos = from;
      while (pos < end) {
        const j = s.indexOf(c, pos);
        if (j < 0 || j >= end) break;
        const r = Math.min(run(s, j, c), end - j);
        const fits = r === n || (r === 3 && n < 3 && c !== "`" && c !== "~");
        const flanks = c === "`" || (!space(s[j - 1]) && s[j - 1] !== "\\");
        const edge = c !== "_" || !ALNUM.test(s[j + r] || "");
        if (fits && flanks && edge) { budget(j - from); return j + r - n; }
        pos = j + r;
      }
      budget(end - from);
      failed[key] = from;
      return -1;
    }
    function wrapped(tag, from, to) {
      const node = el(tag);
      if (depth + 1 < MAX_DEPTH) span(s, from, to, node, depth + 1, inLink, ctx);
      else node.append(s.slice(from, to));
      return node;
    }
    function wrap(tag, from, to, next) {  // s[from, to) in a new <tag>; go on at next
      flush(i);
      const node = wrapped(tag, from, to);
      parent.append(node);
      i = next;
      lit = i;
      return node;
    }
    while (i < end) {
      const c = s[i];
      if (ctx.work > ctx.limit) break;  // out of budget: the rest is text
      if (c === "\\" && i + 1 < end && PUNCT.includes(s[i + 1])) {
        flush(i);
        lit = i + 1;
        i += 2;
        continue;
      }
      if (c === "\n") {
        flush(i);
        parent.append(el("br"));
        i += 1;
        lit = i;
        continue;
      }
      if (c === "`") {
        const n = run(s, i, "`");
        const j = closer("`", n, i + n);
        if (j < 0) { i += n; continue; }
        flush(i);
        let code = s.slice(i + n, j).replace(/\n/g, " ");
        if (code.length > 2 && code[0] === " " && code[code.length - 1] === " ") {
          code = code.slice(1, -1);
        }
        const node = el("code");
        node.textContent = code;
        parent.append(node);
        i = j + n;
        lit = i;
        continue;
      }
      if (c === "*" || c === "_" || c === "~") {
        const n = run(s, i, c);
        const opens = !space(s[i + n]) && (c !== "_" || !ALNUM.test(s[i - 1] || ""));
        if (!opens || (c === "~" && n !== 2)) { i += n; continue; }
        if (n >= 3 && c !== "~") {
          const j = closer(c, 3, i + 3);
          if (j >= 0) {
            flush(i);
            const strong = el("strong");
            strong.append(wrapped("em", i + 3, j));
            parent.append(strong);
            i = j + 3;
            lit = i;
            continue;
          }
          i += n - 2;  // the first n - 2 are text; try the last two as **
          continue;
        }
        const j = closer(c, n, i + n + 1);
        if (j < 0) { i += n; continue; }
        wrap(c === "~" ? "del" : n === 2 ? "strong" : "em", i + n, j, j + n);
        continue;
      }
      if (c === "[" && !inLink && bracket !== -1) {
        if (bracket <= i) {
          const found = s.indexOf("]", i + 1);
          budget((found < 0 || found >= end ? end : found) - i);
          bracket = found < 0 || found >= end ? -1 : found;  // none: no [ after has one
          if (bracket < 0) { i += 1; continue; }
        }
        const close = bracket;
        const target = close + 1 < end && s[close + 1] === "(" ? destination(s, close + 2, end)
                                                               : null;
        const href = target && safeUrl(target.url);
        if (!href) { i += 1; continue; }
        flush(i);
        const a = link(href, parent);
        span(s, i + 1, close, a, depth + 1, true, ctx);
        i = target.next;
        lit = i;
        continue;
      }
      if (c === "<" && !inLink) {
        const limit = Math.min(end, i + MAX_URL);
        let j = i + 1;
        while (j < limit && s[j] !== ">" && s[j] !== "<" && !space(s[j])) j += 1;
        budget(j - i);
        const href = j < limit && s[j] === ">" ? safeUrl(s.slice(i + 1, j)) : null;
        if (!href) { i += 1; continue; }
        flush(i);
        link(href, parent).textContent = s.slice(i + 1, j);
        i = j + 1;
        lit = i;
        continue;
      }
      if (c === "h" && !inLink && (s.startsWith("https://", i) || s.startsWith("http://", i)) &&
          !ALNUM.test(s[i - 1] || "")) {
        let j = i;
        while (j < end && j - i < MAX_URL && !space(s[j]) && s[j] !== "<") j += 1;
        while (j > i && ".,;:!?'\")*_]".includes(s[j - 1])) j -= 1;
        const href = safeUrl(s.slice(i, j));
        if (!href) { i += 1; continue; }
        flush(i);
        link(href, parent).textContent = s.slice(i, j);
        i = j;
        lit = i;
        continue;
      }
      if (c === "&") {
        ENTITY.lastIndex = i;
        const m = ENTITY.exec(s);
        const text = m && m.index + m[0].length <= end ? entity(m) : null;
        if (text === null) { i += 1; continue; }
        flush(i);
        parent.append(text);
        i += m[0].length;
        lit = i;
        continue;
      }
      i += 1;
    }
    flush(end);
  }

  // A link's (destination "title"): the URL and where the link ends, or null.
  function destination(s, i, end) {
    while (i < end && (s[i] === " " || s[i] === "\t")) i += 1;
    let url, j = i;
    if (s[i] === "<") {
      j = i + 1;
      while (j < end && j - i < MAX_URL && s[j] !== ">" && s[j] !== "\n") j += 1;
      if (s[j] !== ">") return null;
      url = s.slice(i + 1, j);
      j += 1;
    } else {
      let depth = 0;
      while (j < end && j - i < MAX_URL && !space(s[j])) {
        if (s[j] === "(") depth += 1;
        else if (s[j] === ")") { if (depth === 0) break; depth -= 1; }
        j += 1;
      }
      url = s.slice(i, j);
    }
    while (j < end && (s[j] === " " || s[j] === "\t")) j += 1;
    if (s[j] === "\"" || s[j] === "'") {  // a title: skipped, a tooltip is not worth it
      const q = s.indexOf(s[j], j + 1);
      if (q < 0 || q >= end || q - j > MAX_URL) return null;
      j = q + 1;
      while (j < end && (s[j] === " " || s[j] === "\t")) j += 1;
    }
    return s[j] === ")" ? {url: url, next: j + 1} : null;
  }

  function entity(m) {
    if (m[3]) return Object.prototype.hasOwnProperty.call(ENTITIES, m[3]) ? ENTITIES[m[3]] : null;
    const code = m[1] ? parseInt(m[1], 16) : parseInt(m[2], 10);
    if (code === 0 || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return "\ufffd";
    return String.fromCodePoint(code);
  }

  function render(text) {
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    const out = document.createDocumentFragment();
    blocks(lines, out, 0, {work: 0, limit: SEARCH_BUDGET * text.length + 10000});
    return out;
  }

  window.llmgwMarkdown = {render: render};
})();
