// A form generated from a runner's config JSON Schema (as pydantic writes them: properties, optional settings as
// anyOf [X, null], enums, $defs). Settings the form cannot express as one input take JSON in a text area.
import { h } from "./dom.js";

const SECRET = /(^|_)(api_?key|key|token|secret|password|passwd|credential)s?$/i;
export const REDACTED = "[redacted]";

function resolve(schema, root) {
  let s = schema || {};
  if (s.$ref && s.$ref.startsWith("#/$defs/")) s = (root.$defs || {})[s.$ref.slice(8)] || {};
  const branches = s.anyOf || s.oneOf;
  if (branches) {
    const real = branches.filter((b) => b.type !== "null");
    if (real.length === 1) return { ...resolve(real[0], root), title: s.title, description: s.description, default: s.default };
  }
  return s;
}

function kindOf(s) {
  if (s.enum) return "enum";
  if (s.type === "boolean") return "boolean";
  if (s.type === "integer" || s.type === "number") return "number";
  if (s.type === "string") return "string";
  if (s.type === "array" && s.items && s.items.type === "string") return "lines";
  return "json";
}

function field(name, schema, initial) {
  const kind = kindOf(schema);
  const id = `cfg-${name}`;
  const secret = SECRET.test(name) && kind === "string";
  const kept = initial === REDACTED;
  let input;
  if (kind === "enum") {
    input = h("select", { id, name }, h("option", { value: "" }, "(default)"), ...schema.enum.map((v) => h("option", { value: JSON.stringify(v) }, String(v))));
    if (initial !== undefined) input.value = JSON.stringify(initial);
  } else if (kind === "boolean") {
    input = h("select", { id, name }, h("option", { value: "" }, "(default)"), h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false"));
    if (initial !== undefined) input.value = String(initial);
  } else if (kind === "number") {
    input = h("input", { id, name, type: "number", step: schema.type === "integer" ? "1" : "any" });
    if (initial !== undefined) input.value = String(initial);
  } else if (kind === "string") {
    input = h("input", { id, name, type: secret ? "password" : "text", autocomplete: "off" });
    if (initial !== undefined && !kept) input.value = initial;
    if (kept) input.placeholder = "(stored secret: leave empty to keep it)";
  } else if (kind === "lines") {
    input = h("textarea", { id, name, rows: "3", placeholder: "one per line" });
    if (Array.isArray(initial)) input.value = initial.join("\n");
  } else {
    input = h("textarea", { id, name, rows: "3", class: "mono", placeholder: "JSON" });
    if (initial !== undefined) input.value = JSON.stringify(initial, null, 2);
  }
  if (schema.default !== undefined && !input.placeholder && kind !== "enum" && kind !== "boolean") {
    input.placeholder = `default: ${JSON.stringify(schema.default)}`;
  }
  const error = h("p", { class: "field-error", "data-error-for": name });
  const wrap = h("div", { class: "field" },
    h("label", { for: id }, schema.title || name),
    input,
    schema.description ? h("p", { class: "hint" }, schema.description) : null,
    error);
  function value() {
    const raw = input.value;
    if (raw === "") return undefined;
    if (kind === "enum") return JSON.parse(raw);
    if (kind === "boolean") return raw === "true";
    if (kind === "number") return Number(raw);
    if (kind === "string") return raw;
    if (kind === "lines") return raw.split("\n").map((l) => l.trim()).filter(Boolean);
    try { return JSON.parse(raw); } catch { throw new Error(`${name}: not valid JSON`); }
  }
  return { name, wrap, value, error, kept };
}

// initial: the binding's config as shown (secrets redacted), or {} for a new binding.
export function schemaForm(schema, initial = {}) {
  const props = (schema && schema.properties) || {};
  const fields = Object.keys(props).map((name) => field(name, resolve(props[name], schema), initial[name]));
  const general = h("ul", { class: "form-errors" });
  const element = h("div", { class: "schema-form" }, ...fields.map((f) => f.wrap), general);
  if (!fields.length) element.prepend(h("p", { class: "muted" }, "This runner takes no settings."));

  function values() {
    const out = {};
    for (const f of fields) {
      const v = f.value();
      if (v !== undefined) out[f.name] = v;
    }
    return out;
  }
  // What to send to change a stored config: changed settings, null for cleared ones; kept secrets are left out.
  function patch() {
    const now = values();
    const out = {};
    for (const f of fields) {
      const before = initial[f.name];
      const after = now[f.name];
      if (f.kept && after === undefined) continue;
      if (after === undefined && before !== undefined) out[f.name] = null;
      else if (after !== undefined && JSON.stringify(after) !== JSON.stringify(before)) out[f.name] = after;
    }
    return out;
  }
  // Problems are "setting: what is wrong" (the host's wording); each goes under its field when one matches.
  function showProblems(problems) {
    for (const f of fields) f.error.textContent = "";
    general.replaceChildren();
    for (const problem of problems) {
      const head = problem.split(":")[0].split(".")[0].trim();
      const f = fields.find((x) => x.name === head);
      if (f) f.error.textContent = f.error.textContent ? `${f.error.textContent}; ${problem}` : problem;
      else general.append(h("li", {}, problem));
    }
  }
  return { element, values, patch, showProblems };
}
