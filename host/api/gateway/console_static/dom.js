// Elements from data, text always as text nodes: nothing a plugin, a model or a user wrote is parsed as HTML.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "—";
}

// Characters that would hide or reorder what a person reads (controls, bidi overrides and isolates, zero-width
// characters, line separators), shown as \uXXXX escapes instead of obeyed.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]/g;

// A name someone else chose (a conversation id a client or chat sent, a runner id or tool name a plugin offers):
// it must read as what it is, so two that look alike are told apart and none reorders the text around it.
export function ident(text) {
  return String(text ?? "").replace(HIDDEN, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}

// JSON a runner wrote (tool arguments), indented for reading, with what could hide in it shown (ident).
export function pretty(text) {
  let out;
  try { out = JSON.stringify(JSON.parse(text), null, 2); } catch { out = String(text); }
  return ident(out);
}
