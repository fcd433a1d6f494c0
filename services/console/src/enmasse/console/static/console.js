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
    cell(row, "actions", edit, deleteForm(address.name));
    return row;
  }

  function rowOf(name) {
    return Array.from(body.rows).find((row) => row.dataset.name === name);
  }

  function upsert(address) {
    const fresh = render(address);
    const old = rowOf(address.name);
    if (old) {
      body.replaceChild(fresh, old);
    } else {
      const after = Array.from(body.rows).find((row) => row.dataset.name > address.name);
      body.insertBefore(fresh, after || null);
    }
    fillFigures(fresh);
  }

  const events = new EventSource(`/spaces/${encodeURIComponent(space)}/events`);
  events.addEventListener("address", (e) => upsert(JSON.parse(e.data)));
  events.addEventListener("removed", (e) => {
    const row = rowOf(JSON.parse(e.data).name);
    if (row) row.remove();
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
