// The space page, live: follows /spaces/<space>/events (server-sent events the console makes
// from the admin API's Watch) and keeps the addresses table as the API says it is.
// No build step, no framework: one EventSource, a few DOM updates.
"use strict";

(function () {
  const table = document.getElementById("addresses");
  if (!table) return;
  const space = table.dataset.space;
  const body = table.tBodies[0];
  const live = document.getElementById("live");
  const failure = document.getElementById("live-error");
  const silent = document.getElementById("figures-silent");
  const lastFigures = new Map(); // address string -> its latest figures, kept across re-renders

  function rate(value) {
    return value === null ? "–" : `${value}/s`;
  }

  function fillFigures(row) {
    const f = lastFigures.get(row.dataset.address);
    const td = row.querySelector("td.figures");
    if (!f || !td) return;
    td.replaceChildren(
      text("div", `in ${rate(f.in_per_second)} (${f.messages_in})`, "in"),
      text("div", `out ${rate(f.out_per_second)} (${f.messages_out})`, "out"),
      text("div", `stored ${f.stored}`, "stored"),
      text("div", `consumers ${f.consumers} · producers ${f.producers === null ? "–" : f.producers}`,
        "links"),
    );
  }

  function text(tag, value, className) {
    const node = document.createElement(tag);
    node.textContent = value;
    if (className) node.className = className;
    return node;
  }

  function cell(row, className, ...children) {
    const td = document.createElement("td");
    td.className = className;
    children.forEach((child) => td.appendChild(child));
    row.appendChild(td);
    return td;
  }

  function deleteForm(name) {
    const form = document.createElement("form");
    form.method = "post";
    form.action = `/spaces/${encodeURIComponent(space)}/addresses/${encodeURIComponent(name)}/delete`;
    const button = text("button", "Delete", "danger");
    button.type = "submit";
    form.appendChild(button);
    return form;
  }

  function render(address) {
    const row = document.createElement("tr");
    row.dataset.name = address.name;
    row.dataset.address = address.address;
    row.dataset.version = address.resource_version;
    cell(row, "name", document.createTextNode(address.name));
    cell(row, "address", text("code", address.address));
    cell(row, "type", document.createTextNode(address.type));
    cell(row, "plan", document.createTextNode(address.plan));
    cell(row, "status", text("span", address.phase, `phase phase-${address.phase}`),
      ...address.why.map((why) => text("div", why, "why")));
    cell(row, "brokers", ...address.brokers.map((b) => text("div", b)));
    cell(row, "dead", document.createTextNode(
      `${address.dead_lettered} / ${address.dead_letters_held} held`));
    cell(row, "figures", text("span", "…", "muted"));
    const edit = text("a", "Edit");
    edit.href = `/spaces/${encodeURIComponent(space)}/addresses/${encodeURIComponent(address.name)}/edit`;
    const traces = text("a", "Traces", "traces");
    traces.href = edit.href.replace(/\/edit$/, "/traces");
    cell(row, "actions", edit, document.createTextNode(" "), traces, deleteForm(address.name));
    return row;
  }

  // Rows by address name: the Watch replays every address on connect (5,000 in a big space),
  // so finding a row must not walk the table each time (that made loading quadratic).
  const rows = new Map(Array.from(body.rows, (row) => [row.dataset.name, row]));

  function rowOf(name) {
    return rows.get(name);
  }

  function upsert(address) {
    const old = rowOf(address.name);
    // The replay on connect repeats what the page was served with: a row that shows this
    // version of the address already is left alone (no DOM change, no re-layout of the table).
    if (old && old.dataset.version === String(address.resource_version)) return;
    const fresh = render(address);
    if (old && old.parentNode === body) {
      body.replaceChild(fresh, old);
    } else {
      const after = Array.from(body.rows).find((row) => row.dataset.name > address.name);
      body.insertBefore(fresh, after || null);
    }
    rows.set(address.name, fresh);
    fillFigures(fresh);
  }

  const events = new EventSource(`/spaces/${encodeURIComponent(space)}/events`);
  events.addEventListener("address", (e) => upsert(JSON.parse(e.data)));
  events.addEventListener("removed", (e) => {
    const name = JSON.parse(e.data).name;
    const row = rowOf(name);
    if (row) row.remove();
    rows.delete(name);
  });
  events.addEventListener("figures", (e) => {
    const data = JSON.parse(e.data);
    lastFigures.clear();
    data.figures.forEach((f) => lastFigures.set(f.address, f));
    Array.from(body.rows).forEach(fillFigures);
    if (silent) {
      silent.textContent = data.silent.length ? `no answer from ${data.silent.join(", ")}` : "";
      silent.hidden = !data.silent.length;
    }
  });
  events.addEventListener("synced", () => {
    live.textContent = "live";
    live.classList.add("on");
  });
  events.addEventListener("failed", (e) => {
    failure.textContent = JSON.parse(e.data).message;
    failure.hidden = false;
    events.close();
    live.textContent = "stopped";
    live.classList.remove("on");
  });
  events.onerror = () => {
    live.textContent = "reconnecting…";
    live.classList.remove("on");
  };
})();
