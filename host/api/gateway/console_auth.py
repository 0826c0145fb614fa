"""Who is signed in to the web console: server-side sessions behind an HttpOnly cookie, CSRF, and the headers every
console response carries.

The key a user signs in with is checked once and never kept: the browser holds only a random session id in an
HttpOnly, SameSite=Strict cookie (Secure when the page came over TLS, a proxy's too), so no script on the page can
read a credential. Only admin credentials may sign in: the console is the admin surface, and a "send" key is for chat
clients. A session ends when it has been idle for IDLE_SECONDS, at MAX_AGE_SECONDS, on sign-out, or as soon as
the admin-scoped credential it was opened with is revoked (a new credential of the same name is another one).

Every API request, reads too, must carry CSRF_HEADER with the session's own token (the sign-in request carries
SIGN_IN_CSRF, as there is no session yet). A cross-site page cannot set a custom header without a CORS preflight,
which the console never answers, and cannot read the token; an Origin header naming another origin is refused
outright. Reads need it because a browser sends a cookie to every port of a host: a page another local user serves
on 127.0.0.1:<any port> receives the console's cookie, and with it alone could read everything the console shows.
The token lives in the console page's localStorage, which is its origin's alone (port included).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from agenthost.host.access.credentials import Credentials, Principal
from agenthost.host.api.gateway.connections import authenticated
from agenthost.host.api.gateway.errors import GatewayError
from agenthost.protos import errors

COOKIE = "agenthost_console"
COOKIE_PATH = "/console"
CSRF_HEADER = "X-Agenthost-CSRF"
SIGN_IN_CSRF = "sign-in"
IDLE_SECONDS = 60 * 60
MAX_AGE_SECONDS = 12 * 60 * 60
MAX_SESSIONS = 64  # the oldest is dropped past this: sessions are for a few operators, not a crowd

# Scripts, styles, images and fetches from the console's own origin only: no inline script or style can run, so
# text a plugin or a model wrote cannot become code even if a renderer slipped; no framing (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@dataclass
class Session:
    principal: Principal
    csrf: str
    created: float
    seen: float


def _key(session_id: str) -> str:
    # The table holds digests, so a dump of it (or a timing side channel on dict lookup) yields no usable cookie.
    return hashlib.sha256(session_id.encode()).hexdigest()


class Sessions:
    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self.clock: Callable[[], float] = time.monotonic  # tests move it forward to expire sessions
        self._sessions: dict[str, Session] = {}

    def sign_in(self, token: str) -> tuple[str, Session]:
        """A new session for an admin credential; raises GatewayError 401 (not valid) or 403 (not admin)."""
        try:
            principal = self.credentials.authenticate((("authorization", f"Bearer {token.strip()}"),))
        except errors.Unauthenticated:
            raise GatewayError(401, "that key is not valid (unknown, or revoked)", code="invalid_key") from None
        if not principal.is_admin:
            raise GatewayError(
                403,
                f"credential {principal.name!r} is a {principal.scope} key; the console needs the admin token or an "
                "admin-scoped credential",
                code="not_admin",
            )
        now = self.clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(principal, secrets.token_urlsafe(32), now, now)
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions, key=lambda k: self._sessions[k].created)
            del self._sessions[oldest]
        self._sessions[_key(session_id)] = session
        return session_id, session

    def sign_out(self, session_id: str) -> None:
        self._sessions.pop(_key(session_id), None)

    def get(self, request: web.Request) -> Session | None:
        """The request's live session, refreshed; None if it has none, or it expired or lost its credential."""
        session_id = request.cookies.get(COOKIE)
        if not session_id:
            return None
        key = _key(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > IDLE_SECONDS or now - session.created > MAX_AGE_SECONDS or not self._valid(session):
            del self._sessions[key]
            return None
        session.seen = now
        authenticated(request)
        return session

    def _valid(self, session: Session) -> bool:
        # The very issue of the credential signed in with (not its name): revoking it, or revoking it and making a
        # new one of the same name (a rotation), ends its sessions at their next request.
        return self.credentials.is_live(session.principal)

    def require(self, request: web.Request) -> Session:
        session = self.get(request)
        if session is None:
            raise GatewayError(
                401, "sign in to the console first (the session is missing or expired)", code="signed_out"
            )
        check_csrf(request, session.csrf)
        return session


def check_csrf(request: web.Request, expected: str) -> None:
    origin = request.headers.get("Origin")
    # The host part only: behind a TLS-terminating proxy the page's origin is https while this server sees http.
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise GatewayError(403, "cross-origin requests are refused", code="cross_origin")
    sent = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise GatewayError(403, f"missing or wrong {CSRF_HEADER} header", code="csrf")


def set_cookie(response: web.StreamResponse, request: web.Request, session_id: str) -> None:
    # Secure when the page came over TLS: to this server, or to the TLS-terminating proxy in front of it, which
    # this server sees as plain HTTP but the browser names in the sign-in's Origin (checked against Host first).
    # Without it the session would also be sent to an http:// URL of the same host, in the clear.
    tls = request.secure or urlsplit(request.headers.get("Origin", "")).scheme == "https"
    response.set_cookie(COOKIE, session_id, path=COOKIE_PATH, httponly=True, samesite="Strict", secure=tls or None)


def clear_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path=COOKIE_PATH)
