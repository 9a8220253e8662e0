// npmdb serve: the query page and the SQL console call the JSON API. No build step, no
// dependencies; every value from the database is inserted as text, never as HTML.
"use strict";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined)
    e.append(c instanceof Node ? c : String(c));
  return e;
}

async function api(path, body) {
  const resp = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                  body: JSON.stringify(body), credentials: "same-origin"});
  let data;
  try { data = await resp.json(); } catch (e) { data = {error: {type: "HTTP", message: resp.statusText}}; }
  if (!resp.ok) throw Object.assign(new Error(data.error ? data.error.message : resp.statusText),
                                    {info: data.error || {}});
  return data;
}

function showError(target, err) {
  target.replaceChildren(el("pre", {class: "error"},
    (err.info && err.info.type ? err.info.type + ": " : "") + err.message));
}

// ---------------------------------------------------------------- query page

function readOptions(form) {
  const f = new FormData(form);
  const opts = {query: f.get("query"), retrieval: f.get("retrieval"), mode: f.get("mode"),
                exact: form.elements.exact.checked};
  // Number, not parseInt: the form accepts 1e1 as ten (parseInt read it as 1); a
  // fraction reaches the API, which says what it takes
  for (const name of ["top", "k", "blocks", "max_len"]) if (f.get(name)) opts[name] = Number(f.get(name));
  if (f.get("tau")) opts.tau = parseFloat(f.get("tau"));
  return opts;
}

function docLink(ev, version, phrase) {
  // the id as one path segment; "." and ".." (which a browser drops from any path) as ?id=
  const q = new URLSearchParams({version: version, start: ev.start, end: ev.end, phrase: phrase});
  if (ev.doc_id === "." || ev.doc_id === "..") return "/document?" + new URLSearchParams({id: ev.doc_id}) + "&" + q;
  return "/documents/" + encodeURIComponent(ev.doc_id) + "?" + q.toString();
}

function renderAnswers(res) {
  const top = Math.max(1e-12, ...res.answers.map(a => a.score));
  const col = el("section", {class: "answers", "data-version": res.version},
    el("h2", {}, "version " + res.version),
    el("p", {class: "hint meta"}, "generation " + res.generation + " · " + res.ms.toFixed(1) +
       " ms · " + res.answers.length + " answers"));
  if (!res.answers.length) col.append(el("p", {}, "(no answers)"));
  const list = el("ol", {class: "answer-list"});
  for (const a of res.answers) {
    const evs = el("ul", {class: "evidence"});
    for (const ev of a.evidence) {
      const snip = ev.match !== undefined
        ? el("span", {class: "snippet"}, ev.before, el("mark", {class: "span"}, ev.match), ev.after)
        : el("span", {class: "snippet"}, ev.snippet);
      evs.append(el("li", {},
        el("a", {href: docLink(ev, res.version, a.text), class: "doc-link", title: ev.title},
           ev.doc_id), " ", snip));
    }
    list.append(el("li", {class: "answer"},
      el("div", {class: "answer-head"},
        el("span", {class: "answer-text"}, a.text),
        el("span", {class: "bar"}, el("span", {class: "fill", style: "width:" + (100 * a.score / top).toFixed(1) + "%"})),
        el("span", {class: "num score"}, a.score.toFixed(4)),
        el("span", {class: "num support", title: "support: occurrences"}, "×" + a.support)),
      evs));
  }
  col.append(list);
  return col;
}

function renderPlan(res) {
  const max = Math.max(1e-9, ...res.stats.map(s => s.ms));
  const ordered = [...res.stats].sort((a, b) => a.depth - b.depth);
  const rows = ordered.map(s => el("div", {class: "plan-row"},
    el("span", {class: "op", style: "padding-left:" + (s.depth * 0.9) + "em", title: s.detail},
       s.operator),
    el("span", {class: "bar"}, el("span", {class: "fill", style: "width:" + (100 * s.ms / max).toFixed(1) + "%"})),
    el("span", {class: "num"}, s.ms.toFixed(2) + " ms"),
    el("span", {class: "num rows"}, s.rows + " rows")));
  document.getElementById("plan").replaceChildren(...rows);
  document.getElementById("plan-text").textContent = res.plan;
  document.getElementById("plan-section").hidden = false;
}

function initQuery() {
  const form = document.getElementById("ask");
  const status = document.getElementById("status");
  const results = document.getElementById("results");
  let latest = 0;  // a response to an earlier submit never replaces a later one's
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const mine = ++latest;
    const opts = readOptions(form);
    const versions = [form.elements.version.value, form.elements.compare.value].filter((v, i) => i === 0 || v);
    status.textContent = "running…";
    status.className = "";
    try {
      const answers = await Promise.all(versions.map(v => {
        const o = Object.assign({}, opts);
        if (v) o.version = /^\d+$/.test(v) ? parseInt(v, 10) : v;
        return api("/api/fill_mask", o);
      }));
      if (mine !== latest) return;
      results.replaceChildren(...answers.map(renderAnswers));
      results.classList.toggle("compare", answers.length > 1);
      renderPlan(answers[0]);
      status.textContent = "done";
      status.className = "done";
    } catch (err) {
      if (mine !== latest) return;
      showError(status, err);
      status.className = "failed";
      results.replaceChildren();  // the answers of the query before are not this one's
      document.getElementById("plan-section").hidden = true;
    }
  });
}

// ---------------------------------------------------------------- SQL console

function renderTable(data) {
  const head = el("tr", {}, ...data.columns.map(c => el("th", {}, c)));
  const body = data.rows.map(r => el("tr", {}, ...r.map(v => {
    const num = typeof v === "number";
    const text = v === null ? "NULL" : (typeof v === "object" ? JSON.stringify(v) : (num && !Number.isInteger(v) ? v.toFixed(4) : v));
    return el("td", num ? {class: "num"} : {}, text);
  })));
  return el("table", {class: "grid"}, el("thead", {}, head), el("tbody", {}, ...body));
}

function initSql() {
  const form = document.getElementById("sql-form");
  const text = document.getElementById("sql");
  const status = document.getElementById("status");
  const errBox = document.getElementById("sql-error");
  const out = document.getElementById("sql-result");
  let latest = 0;  // a response to an earlier run never replaces a later one's
  const run = async () => {
    const mine = ++latest;
    status.textContent = "running…";
    errBox.hidden = true;
    try {
      const data = await api("/api/sql", {query: text.value});
      if (mine !== latest) return;
      // the API says which results are EXPLAIN's; a column merely named "plan" is data
      out.replaceChildren(data.explain === true ? el("pre", {}, data.plan) : renderTable(data));
      status.textContent = data.rows.length + " rows · " + data.ms.toFixed(1) + " ms" +
        (data.version !== null ? " · version " + data.version : "") + (data.truncated ? " (cut)" : "");
    } catch (err) {
      if (mine !== latest) return;
      // a network failure rejects fetch with a TypeError that has no .info
      errBox.textContent = (err.info && err.info.type ? err.info.type + ": " : "") + err.message;
      errBox.hidden = false;
      status.textContent = "error";
      out.replaceChildren();
    }
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); run(); });
  text.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); run(); }
  });
}

const page = document.body.dataset.page;
if (page === "query") initQuery();
if (page === "sql") initSql();
if (page === "document") {
  const cur = document.querySelector("mark.current");
  if (cur) cur.scrollIntoView({block: "center"});
}
