// A tool call waiting for a person, as a card: what the runner wants to run and why, a countdown to its expiry, one
// button per option the host offered (so new options need no new code), a note, and — once it is resolved — how it
// ended. Used by the chat and run pages (through EVENT_RENDERERS) and by the pending approvals page. Everything but
// the ids, the expiry and the options is the runner's text: it goes in as text nodes only.
import * as api from "./api.js";
import { h, ident, pretty } from "./dom.js";

// "requested" when a card is made for a new request, "decided" after this page decides one: the nav's pending
// count refreshes at once.
export const approvalEvents = new EventTarget();

const ENDED = {
  approved: "✓ approved",
  denied: "✗ denied",
  timeout: "⏱ timed out",
  cancelled: "cancelled",
};

export function resolvedText(resolved) {
  const how = ENDED[resolved.outcome] || resolved.outcome;
  const who = resolved.decided_by ? ` by ${resolved.decided_by}` : "";
  return `${how}${who}${resolved.note ? ` — ${resolved.note}` : ""}`;
}

function countdown(expiresAt) {
  const left = Math.round(Number(expiresAt) - Date.now() / 1000);
  if (left <= 0) return "expired";
  const m = Math.floor(left / 60);
  const s = String(left % 60).padStart(2, "0");
  return `expires in ${m}:${s}`;
}

// `request` is an ApprovalRequested (protobuf JSON); `context` optionally names the bot and run (for the list page).
// Returns { element, resolve(resolved) }; resolve may be called more than once (the decision's reply and the
// approval_resolved event both carry it).
export function approvalCard(request, context = null) {
  const id = request.approval_id;
  const expiry = h("span", { class: "approval-expiry muted" }, countdown(request.expires_at));
  const note = h("input", { class: "approval-note", type: "text", maxlength: "1000", placeholder: "note (optional, shown to the model)", "aria-label": "note" });
  const status = h("div", { class: "approval-status" });
  const buttons = (request.options || []).map((option) => h("button", {
    type: "button",
    class: option.id === "approve" ? "" : "secondary",
    "data-option": option.id,
    onclick: () => decide(option.id),
  }, option.label || option.id));
  const actions = h("div", { class: "approval-actions" }, note, h("div", { class: "inline" }, buttons));
  const args = request.arguments_json
    ? h("details", { class: "approval-args" },
      h("summary", {}, "arguments", request.arguments_truncated ? " (cut short)" : ""),
      h("pre", { class: "mono" }, pretty(request.arguments_json)))
    : null;
  const element = h("div", { class: "approval pending", "data-approval": id },
    h("div", { class: "row" },
      h("strong", {}, "Approval needed: "), h("code", {}, ident(request.tool_name)),
      h("span", { class: "spacer" }), expiry),
    context ? h("div", { class: "muted small" }, "bot ", context.bot, " · run ",
      h("a", { href: `#/runs/${encodeURIComponent(context.run_id)}` }, context.run_id)) : null,
    request.summary ? h("div", { class: "approval-summary mono" }, request.summary) : null,
    // Set by the host only, when the request came with the run's tool token.
    request.from_sandbox ? h("div", { class: "approval-reason" },
      "⚠ Asked from inside the run's sandbox (the agent's harness, or a command the model ran): nobody has checked this text.") : null,
    request.reason ? h("div", { class: "approval-reason muted" }, request.reason) : null,
    args, actions, status);

  let done = false;
  let seen = false;
  // A request seen live in a chat (not one the list page itself fetched, nor one its run already resolved).
  if (!context) queueMicrotask(() => { if (!done) approvalEvents.dispatchEvent(new Event("requested")); });
  const timer = setInterval(() => {
    // Stops when the card is resolved, or was shown and has since left the page.
    if (element.isConnected) seen = true;
    if (done || (seen && !element.isConnected)) return clearInterval(timer);
    expiry.textContent = countdown(request.expires_at);
  }, 1000);

  function resolve(resolved) {
    done = true;
    clearInterval(timer);
    element.classList.remove("pending");
    element.classList.add("resolved", `outcome-${resolved.outcome}`);
    element.dataset.outcome = resolved.outcome;
    expiry.textContent = "";
    actions.remove();
    status.replaceChildren(h("span", { class: "approval-outcome" }, resolvedText(resolved)));
  }

  async function decide(option) {
    for (const b of buttons) b.disabled = true;
    status.replaceChildren();
    try {
      const info = await api.post(`approvals/${encodeURIComponent(id)}`, { decision: option, note: note.value });
      resolve(info.resolved);
      approvalEvents.dispatchEvent(new Event("decided"));
    } catch (err) {
      status.replaceChildren(h("p", { class: "error", role: "alert" }, err.message || String(err)));
      // Decided elsewhere already (409) or gone (404): nothing left to click.
      if (!(err instanceof api.ApiError && (err.status === 409 || err.status === 404))) {
        for (const b of buttons) b.disabled = false;
      }
    }
  }

  // No longer pending, outcome unknown here (the list page saw it vanish: decided elsewhere, timed out, run ended).
  function gone() {
    if (done) return;
    done = true;
    clearInterval(timer);
    element.classList.remove("pending");
    element.classList.add("resolved");
    actions.remove();
    expiry.textContent = "";
    status.replaceChildren(h("span", { class: "approval-outcome muted" }, "no longer pending (see the run)"));
  }

  return { element, resolve, gone };
}
