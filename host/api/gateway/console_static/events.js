// Run events as rows, for the live chat and the run page alike. A RunEvent arrives as protobuf JSON: one key names
// its kind (text_delta, tool_started, ...), beside seq and created_at.
//
// Hook for new kinds: add a renderer to EVENT_RENDERERS. Kinds without one still show, as a generic row with the
// event's fields, so nothing the host sends is hidden.
import { approvalCard, resolvedText } from "./approvals.js";
import { h, ident, pretty } from "./dom.js";

export function eventKind(event) {
  return Object.keys(event).find((k) => k !== "seq" && k !== "created_at") || "unknown";
}

function jsonBlock(value) {
  return h("pre", { class: "mono" }, JSON.stringify(value, null, 2));
}

// Each renderer gets (data, view) and either returns a row element or updates one it made before
// (view.tools maps tool_call_id to the row of that call, view.approvals approval_id to its card).
export const EVENT_RENDERERS = {
  tool_started(data, view) {
    const status = h("span", { class: "tool-status" }, "running…");
    const result = h("div", { class: "tool-result" });
    const row = h("details", { class: "event tool", "data-tool": data.tool_name },
      h("summary", {}, "⚙ ", h("code", {}, ident(data.tool_name)), " ", status),
      h("p", { class: "muted" }, "arguments"), h("pre", { class: "mono" }, pretty(data.arguments_json || "{}")),
      result);
    view.tools.set(data.tool_call_id, { row, status, result });
    return row;
  },
  tool_finished(data, view) {
    const known = view.tools.get(data.tool_call_id);
    if (!known) return h("div", { class: "event" }, `tool ${ident(data.tool_name)} finished: ${data.result}`);
    known.status.textContent = data.is_error ? "✗ error" : "✓ done";
    known.row.classList.add(data.is_error ? "tool-error" : "tool-ok");
    known.result.replaceChildren(h("p", { class: "muted" }, "result"), h("pre", { class: "mono" }, pretty(data.result)));
    return null;
  },
  usage(data) {
    const cost = data.cost_usd ? ` · $${Number(data.cost_usd).toFixed(4)}` : "";
    return h("div", { class: "event muted" },
      `usage: ${data.input_tokens} in / ${data.output_tokens} out tokens${data.model ? ` (${data.model})` : ""}${cost}`);
  },
  retry: (d) => h("div", { class: "event muted" }, `retry ${d.attempt} in ${Number(d.delay_seconds).toFixed(1)}s: ${d.reason}`),
  progress: (d) => h("div", { class: "event muted" }, `… ${d.message}`),
  compaction: (d) => h("div", { class: "event muted" }, `compacted ${d.tokens_before} → ${d.tokens_after} tokens`),
  completed: (d) => h("div", { class: "event muted" }, `completed (${d.finish_reason || "stop"})`),
  failed: (d) => h("div", { class: "event error" }, `failed: ${d.code} ${d.message}`),
  message: (d) => h("div", { class: "event" }, `${d.role || "assistant"}: ${d.text}`),
  approval_requested(data, view) {
    const card = approvalCard(data);
    view.approvals.set(data.approval_id, card);
    return card.element;
  },
  approval_resolved(data, view) {
    const card = view.approvals.get(data.approval_id);
    if (!card) return h("div", { class: "event muted" }, `approval ${data.approval_id}: ${resolvedText(data)}`);
    card.resolve(data);
    return null;
  },
};

// A view renders one run's events into `container`; text deltas extend the current text block.
export function eventView(container) {
  const view = { tools: new Map(), approvals: new Map(), text: null };
  view.add = (event) => {
    const kind = eventKind(event);
    const data = event[kind];
    if (kind === "text_delta") {
      if (!view.text) {
        view.text = h("div", { class: "assistant-text" });
        container.append(view.text);
      }
      view.text.append(document.createTextNode(data.text));
      return;
    }
    view.text = null;
    const render = EVENT_RENDERERS[kind];
    const row = render
      ? render(data, view)
      : h("details", { class: "event generic", "data-kind": kind }, h("summary", {}, kind), jsonBlock(data));
    if (row) container.append(row);
  };
  return view;
}
