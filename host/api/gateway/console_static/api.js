// The console's only door to the host: JSON over fetch with the session cookie (HttpOnly: this code never sees it)
// and, on every request, the token the server handed out at sign-in. The token is kept in localStorage, which is
// this origin's alone, port included (a browser sends the cookie to every port of the host, so the cookie alone
// opens nothing); the console's other tabs and a reload resume with it.
const CSRF_HEADER = "X-Agenthost-CSRF";
const STORED = "agenthost-console-csrf";
let csrf = localStorage.getItem(STORED) || "";

function keep(token) {
  csrf = token;
  if (token) localStorage.setItem(STORED, token);
  else localStorage.removeItem(STORED);
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error ? body.error.code : null;
  }
}

async function request(method, path, body, token) {
  const headers = {};
  headers[CSRF_HEADER] = token || csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(`/console/api/${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  return response;
}

async function json(method, path, body, token) {
  const response = await request(method, path, body, token);
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const get = (path) => json("GET", path);
export const post = (path, body) => json("POST", path, body ?? {});
export const patch = (path, body) => json("PATCH", path, body);
export const del = (path) => json("DELETE", path);

export async function signIn(token) {
  const data = await json("POST", "session", { token }, "sign-in");
  keep(data.csrf);
  return data;
}

export async function resume() {
  if (!csrf) throw new ApiError(401, null);
  return await get("session");
}

export async function signOut() {
  await del("session").catch(() => {});
  keep("");
}

// POSTs a message and calls onEvent(kind, data) for each server-sent event of the run as it arrives.
export async function streamChat(bot, body, onEvent) {
  const response = await request("POST", `bots/${encodeURIComponent(bot)}/chat`, body);
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (data.length) onEvent(kind, JSON.parse(data.join("\n")));
    }
  }
}
