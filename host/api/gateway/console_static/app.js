// The console's pages, routed by the URL fragment: #/bots, #/bots/NAME, #/runs, #/runs/ID, #/plugins, #/approvals.
import * as api from "./api.js";
import { approvalCard, approvalEvents } from "./approvals.js";
import { h, ident, when } from "./dom.js";
import { eventView } from "./events.js";
import { schemaForm } from "./form.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const pendingCount = document.getElementById("approvals-count");
const POLL_MS = 5000;
let signedIn = false;
let pollTimer = null;
let approvalsList = null; // the pending approvals page while it is shown: merges each refresh into its cards

function show(...children) {
  main.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

function errorLine(err) {
  return h("p", { class: "error", role: "alert" }, err.message || String(err));
}

function tokens(usage) {
  if (!usage) return "—";
  return `${Number(usage.input_tokens || 0)} in / ${Number(usage.output_tokens || 0)} out`;
}

function cost(usage) {
  // Only what the runner reported: the host keeps no price list, and the console invents none.
  return usage && usage.cost_usd ? `$${Number(usage.cost_usd).toFixed(4)}` : "—";
}

// ---- sign-in ----

function signInPage(message) {
  const token = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const status = h("div", {});
  const form = h("form", { class: "card narrow", id: "sign-in" },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "Admin token"),
    token,
    h("p", { class: "hint" }, "The host's admin token is in <data dir>/admin.token (default ~/.agenthost/admin.token). An admin-scoped credential works too; a send key does not."),
    h("button", { type: "submit" }, "Sign in"),
    status);
  if (message) status.append(errorLine({ message }));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      await api.signIn(token.value);
      signedIn = true;
      token.value = "";
      location.hash = "#/bots";
      route();
    } catch (err) {
      status.replaceChildren(errorLine(err));
    }
  });
  nav.hidden = true;
  show(form);
  token.focus();
}

// ---- bots ----

async function botsPage() {
  const { bots } = await api.get("bots");
  const name = h("input", { id: "bot-name", placeholder: "name", required: true });
  const description = h("input", { id: "bot-description", placeholder: "description (optional)" });
  const status = h("div", {});
  const form = h("form", { class: "inline", id: "create-bot" }, name, description, h("button", { type: "submit" }, "Create bot"), status);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      await api.post("bots", { name: name.value, description: description.value });
      route();
    } catch (err) {
      status.replaceChildren(errorLine(err));
    }
  });
  const rows = bots.map((b) => h("tr", {},
    h("td", {}, h("a", { href: `#/bots/${encodeURIComponent(b.name)}` }, b.name)),
    h("td", {}, b.description), h("td", { class: "muted" }, when(b.created_at))));
  show(h("h1", {}, "Bots"),
    h("table", { id: "bots" }, h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Description"), h("th", {}, "Created"))), h("tbody", {}, rows)),
    bots.length ? null : h("p", { class: "muted" }, "No bots yet."),
    h("h2", {}, "New bot"), form);
}

function bindingCard(binding, runners, reload) {
  const runner = runners.find((r) => r.runner_id === binding.runner_id);
  const body = h("div", {});
  const card = h("div", { class: "card binding", "data-binding": binding.binding_id },
    h("div", { class: "row" },
      h("strong", {}, ident(binding.runner_id)),
      h("span", { class: "muted" }, `priority ${binding.priority} · ${binding.event_pattern}${binding.conversation_pattern ? ` · ${binding.conversation_pattern}` : ""}`),
      h("span", { class: "spacer" }),
      h("button", { type: "button", class: "secondary", onclick: () => edit() }, "Edit config"),
      h("button", { type: "button", class: "danger", onclick: () => remove() }, "Delete")),
    h("pre", { class: "mono config" }, JSON.stringify(binding.config, null, 2)),
    body);
  async function remove() {
    if (!confirm(`Delete the binding to ${ident(binding.runner_id)}?`)) return;
    try { await api.del(`bindings/${binding.binding_id}`); reload(); } catch (err) { body.replaceChildren(errorLine(err)); }
  }
  function edit() {
    const form = schemaForm(runner ? runner.config_schema : {}, binding.config);
    const status = h("div", {});
    const save = h("button", { type: "submit" }, "Save");
    const el = h("form", { class: "edit-binding" }, form.element, save,
      h("button", { type: "button", class: "secondary", onclick: () => body.replaceChildren() }, "Cancel"), status);
    el.addEventListener("submit", async (e) => {
      e.preventDefault();
      status.replaceChildren();
      try {
        const change = form.patch();
        const { problems } = await api.post("validate-config", { binding_id: binding.binding_id, config_patch: change });
        form.showProblems(problems);
        if (problems.length) return;
        await api.patch(`bindings/${binding.binding_id}`, { config_patch: change });
        reload();
      } catch (err) {
        status.replaceChildren(errorLine(err));
      }
    });
    body.replaceChildren(el);
  }
  return card;
}

function bindForm(bot, runners, reload) {
  const select = h("select", { id: "runner" }, h("option", { value: "" }, "choose a runner…"),
    ...runners.map((r) => h("option", { value: r.runner_id }, ident(r.runner_id))));
  const priority = h("input", { id: "priority", type: "number", step: "1", placeholder: "priority (0)" });
  const slot = h("div", {});
  const status = h("div", {});
  let form = null;
  select.addEventListener("change", () => {
    const runner = runners.find((r) => r.runner_id === select.value);
    form = runner ? schemaForm(runner.config_schema, {}) : null;
    slot.replaceChildren(...(runner ? [h("p", { class: "hint" }, runner.description), form.element] : []));
  });
  const el = h("form", { id: "bind" }, h("div", { class: "inline" }, select, priority), slot, h("button", { type: "submit" }, "Bind"), status);
  el.addEventListener("submit", async (e) => {
    e.preventDefault();
    status.replaceChildren();
    if (!form) return status.replaceChildren(errorLine({ message: "choose a runner" }));
    try {
      const config = form.values();
      const { problems } = await api.post("validate-config", { runner_id: select.value, config });
      form.showProblems(problems);
      if (problems.length) return;
      const body = { runner_id: select.value, config };
      if (priority.value !== "") body.priority = Number(priority.value);
      await api.post(`bots/${encodeURIComponent(bot)}/bindings`, body);
      reload();
    } catch (err) {
      status.replaceChildren(errorLine(err));
    }
  });
  return el;
}

function newConversation() {
  // getRandomValues, not randomUUID: the latter exists only in secure contexts, and a gateway may be plain HTTP.
  const bytes = crypto.getRandomValues(new Uint8Array(4));
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function chatPanel(bot) {
  let conversation = newConversation();
  const label = h("code", { id: "conversation" }, conversation);
  const log = h("div", { class: "chat-log", id: "chat-log" });
  const input = h("textarea", { id: "chat-input", rows: "2", placeholder: "Message the bot…" });
  const send = h("button", { type: "submit", id: "chat-send" }, "Send");
  const form = h("form", { class: "chat-form" }, input, send);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    send.disabled = true;
    log.append(h("div", { class: "bubble user" }, text));
    const reply = h("div", { class: "bubble bot" });
    const meta = h("div", { class: "run-meta muted" });
    log.append(reply, meta);
    const view = eventView(reply);
    try {
      await api.streamChat(bot, { text, conversation_id: conversation }, (kind, data) => {
        if (kind === "queued") {
          const line = data.waiting_on === "conversation" ? "behind this conversation's earlier runs" : "for a free slot";
          meta.replaceChildren("run ", h("a", { href: `#/runs/${data.run.run_id}` }, data.run.run_id), ` · queued ${line}, position ${data.position}…`);
        } else if (kind === "run_started") meta.replaceChildren("run ", h("a", { href: `#/runs/${data.run_id}` }, data.run_id), " · running…");
        else if (kind === "run_event") view.add(data);
        else if (kind === "run_finished") {
          meta.replaceChildren("run ", h("a", { href: `#/runs/${data.run_id}` }, data.run_id),
            ` · ${data.status} · ${tokens(data.usage)} tokens`, data.usage && data.usage.cost_usd ? ` · ${cost(data.usage)}` : "");
          meta.dataset.status = data.status;
          if (data.status !== "completed") reply.append(errorLine({ message: `${data.status}: ${data.error_code} ${data.error_message}` }));
        } else if (kind === "error") reply.append(errorLine({ message: data.error.message }));
        log.scrollTop = log.scrollHeight;
      });
    } catch (err) {
      reply.append(errorLine(err));
    } finally {
      send.disabled = false;
    }
  });
  const fresh = h("button", { type: "button", class: "secondary", onclick: () => {
    conversation = newConversation();
    label.textContent = conversation;
    log.replaceChildren();
  } }, "New conversation");
  return h("section", { class: "card", id: "chat" }, h("div", { class: "row" }, h("h2", {}, "Debug chat"), h("span", { class: "spacer" }), h("span", { class: "muted" }, "conversation "), label, fresh), log, form);
}

async function botPage(name) {
  const [{ bot, bindings }, { runners }] = await Promise.all([api.get(`bots/${encodeURIComponent(name)}`), api.get("runners")]);
  const reload = () => botPage(name).catch(failed);
  show(h("h1", {}, bot.name, " ", h("span", { class: "muted small" }, bot.bot_id)),
    bot.description ? h("p", {}, bot.description) : null,
    h("section", { id: "bindings" }, h("h2", {}, "Bindings"),
      bindings.length ? bindings.map((b) => bindingCard(b, runners, reload)) : h("p", { class: "muted" }, "Not bound to a runner yet."),
      h("h3", {}, "Bind a runner"), bindForm(bot.name, runners, reload)),
    chatPanel(bot.name),
    h("p", {}, h("a", { href: `#/runs?bot=${encodeURIComponent(bot.name)}` }, "This bot's runs →")));
}

// ---- runs ----

async function runsPage(query) {
  const bot = query.get("bot") || "";
  const { runs } = await api.get(`runs?limit=100${bot ? `&bot=${encodeURIComponent(bot)}` : ""}`);
  const rows = runs.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `#/runs/${r.run_id}` }, r.run_id)),
    h("td", { class: `status ${r.status}` }, r.status),
    h("td", {}, ident(r.runner_id)), h("td", {}, ident(r.conversation_id)),
    h("td", {}, tokens(r.usage)), h("td", {}, cost(r.usage)), h("td", { class: "muted" }, when(r.created_at))));
  show(h("h1", {}, "Runs", bot ? ` of ${bot}` : ""),
    h("table", { id: "runs" }, h("thead", {}, h("tr", {}, ...["Run", "Status", "Runner", "Conversation", "Tokens", "Cost", "Created"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)),
    runs.length ? null : h("p", { class: "muted" }, "No runs yet."));
}

async function runPage(runId) {
  const { run, events, has_more } = await api.get(`runs/${encodeURIComponent(runId)}`);
  const u = run.usage || {};
  const facts = [
    ["Status", run.status], ["Bot", h("a", { href: `#/bots/${encodeURIComponent(run.bot_id)}` }, run.bot_id)], ["Runner", ident(run.runner_id)], ["Conversation", ident(run.conversation_id)],
    ["Created", when(run.created_at)], ["Finished", when(run.finished_at)],
    ["Input tokens", u.input_tokens], ["Output tokens", u.output_tokens], ["Cache read", u.cache_read_tokens],
    ["Cache write", u.cache_write_tokens], ["Model", u.model || "—"], ["Cost", cost(u)],
  ];
  if (run.error_code) facts.push(["Error", `${run.error_code}: ${run.error_message}`]);
  const list = h("div", { class: "events", id: "events" });
  const view = eventView(list);
  for (const event of events) view.add(event);
  const cancel = ["queued", "running"].includes(run.status)
    ? h("button", { type: "button", class: "danger", onclick: async () => { await api.post(`runs/${run.run_id}/cancel`); route(); } }, "Cancel run") : null;
  show(h("h1", {}, "Run ", h("code", {}, run.run_id)), cancel,
    h("dl", { class: "facts", id: "run-facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-fact": k }, v ?? "—")])),
    h("h2", {}, "Events"), list, has_more ? h("p", { class: "muted" }, "(more events than shown)") : null);
}

// ---- plugins ----

async function pluginsPage() {
  const { plugins } = await api.get("plugins");
  const logs = h("section", { id: "logs" });
  async function showLogs(id) {
    try {
      const { lines } = await api.get(`plugins/${encodeURIComponent(id)}/logs?lines=200`);
      logs.replaceChildren(h("div", { class: "row" }, h("h2", {}, `Log of ${id}`), h("span", { class: "spacer" }),
        h("button", { type: "button", class: "secondary", id: "refresh-logs", onclick: () => showLogs(id) }, "Refresh")),
        h("pre", { class: "mono log" }, lines.length ? lines.join("\n") : "(no log lines)"));
    } catch (err) {
      logs.replaceChildren(errorLine(err));
    }
  }
  const rows = plugins.map((p) => h("tr", { "data-plugin": p.plugin_id },
    h("td", {}, h("strong", {}, p.plugin_id), h("div", { class: "muted small" }, `${p.version} · ${p.runners.join(", ")}`)),
    h("td", { class: `state ${p.state}` }, p.state),
    h("td", {}, p.enabled ? "enabled" : "disabled"),
    h("td", {}, String(p.restarts)), h("td", {}, p.pid ? String(p.pid) : "—"),
    h("td", { class: "error small" }, p.last_error),
    h("td", {},
      h("button", { type: "button", class: "secondary", onclick: async (e) => {
        e.target.disabled = true;
        try { await api.post(`plugins/${encodeURIComponent(p.plugin_id)}/enabled`, { enabled: !p.enabled }); route(); }
        catch (err) { logs.replaceChildren(errorLine(err)); e.target.disabled = false; }
      } }, p.enabled ? "Disable" : "Enable"),
      h("button", { type: "button", class: "secondary", onclick: () => showLogs(p.plugin_id) }, "Logs"))));
  show(h("h1", {}, "Plugins"),
    h("table", { id: "plugins" }, h("thead", {}, h("tr", {}, ...["Plugin", "State", "", "Restarts", "PID", "Last error", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows)),
    logs);
}

// ---- approvals ----

// The nav's pending count (and the approvals page, when shown) follow the host: polled while signed in, and at once
// when this page decides or a chat shows a new request.
async function refreshApprovals() {
  if (!signedIn) return;
  try {
    const { approvals } = await api.get("approvals");
    pendingCount.textContent = String(approvals.length);
    pendingCount.hidden = approvals.length === 0;
    if (approvalsList && approvalsList.element.isConnected) approvalsList.merge(approvals);
  } catch (err) {
    if (err instanceof api.ApiError && err.status === 401) failed(err);
  }
}

function startPolling() {
  if (pollTimer === null) pollTimer = setInterval(refreshApprovals, POLL_MS);
}

function stopPolling() {
  clearInterval(pollTimer);
  pollTimer = null;
  pendingCount.hidden = true;
}

approvalEvents.addEventListener("decided", refreshApprovals);
approvalEvents.addEventListener("requested", refreshApprovals);

async function approvalsPage() {
  const { approvals } = await api.get("approvals");
  const element = h("div", { id: "approvals" });
  const empty = h("p", { class: "muted", id: "no-approvals" }, "No tool call is waiting for a decision.");
  const cards = new Map();
  function merge(current) {
    const ids = new Set(current.map((a) => a.approval_id));
    for (const [id, card] of cards) if (!ids.has(id)) card.gone();
    for (const a of current) {
      if (cards.has(a.approval_id)) continue;
      const card = approvalCard(a.request, { bot: a.bot_name || a.bot_id, run_id: a.run_id });
      cards.set(a.approval_id, card);
      element.append(card.element);
    }
    empty.hidden = current.length > 0;
  }
  merge(approvals);
  approvalsList = { element, merge };
  show(h("h1", {}, "Pending approvals"),
    h("p", { class: "hint" }, "Tool calls waiting for a person, every bot's, oldest first; new ones appear as they come."),
    empty, element);
}

// ---- routing ----

function failed(err) {
  if (err instanceof api.ApiError && err.status === 401) {
    signedIn = false;
    stopPolling();
    return signInPage("Your session ended; sign in again.");
  }
  show(errorLine(err));
}

async function route() {
  if (!signedIn) {
    try { await api.resume(); signedIn = true; } catch { return signInPage(); }
  }
  nav.hidden = false;
  startPolling();
  refreshApprovals();
  const [path, search] = (location.hash.slice(1) || "/bots").split("?");
  const query = new URLSearchParams(search || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of nav.querySelectorAll("a")) a.classList.toggle("active", a.dataset.nav === parts[0]);
  try {
    if (parts[0] === "bots" && parts[1]) await botPage(parts[1]);
    else if (parts[0] === "runs" && parts[1]) await runPage(parts[1]);
    else if (parts[0] === "runs") await runsPage(query);
    else if (parts[0] === "plugins") await pluginsPage();
    else if (parts[0] === "approvals") await approvalsPage();
    else await botsPage();
  } catch (err) {
    failed(err);
  }
}

document.getElementById("sign-out").addEventListener("click", async () => {
  stopPolling();
  await api.signOut();
  signedIn = false;
  signInPage();
});
window.addEventListener("hashchange", route);
route();
