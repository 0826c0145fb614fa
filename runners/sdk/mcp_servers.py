"""A binding's own MCP servers (`mcp_servers` in the local agent's and the harness runners' configs): the shared
config model and the `${KEY}` references that bring binding secrets into a server's env and headers.

Binding configs are stored and listed by the host, so a secret never sits in one: a value that is secret-shaped
(an env var or header whose name says key, token, auth…) must be a reference to a key the host stores and the
binding names (`agenthost keys set NAME`, `bots bind --key NAME`), resolved per run from `RunContext.secrets`.
This module is pure config: it imports nothing of the MCP SDK, so bindings without servers never load it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agenthost.plugins.binding_paths import path_setting
from agenthost.plugins.sandbox import SECRET_NAME

SERVER_NAME = re.compile(r"^[a-z0-9_-]{1,32}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]{0,127})\}")
MAX_SERVERS = 16
# Names the runner sets itself in a stdio server's environment.
RESERVED_ENV = frozenset({"HOME", "PWD", "PATH"})


class McpServerError(ValueError):
    """A server's settings cannot be used for this run (a missing key); the message names the setting."""


class McpServer(BaseModel):
    """One MCP server a binding adds. stdio: a command the runner starts (sandboxed); http: a streamable-HTTP
    endpoint. Its tools reach the model as `mcp__<name>__<tool>`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="a-z, 0-9, '_' and '-', at most 32 chars; unique in the binding.")
    transport: Literal["stdio", "http"]
    command: str | None = Field(default=None, description="stdio: the executable (absolute, or found on PATH).")
    args: list[str] = Field(default_factory=list, description="stdio: its arguments (literal).")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="stdio: environment for the server; values may contain ${KEY} references to the binding's "
        "keys, and secret-shaped names (…KEY, …TOKEN, …) must use them.",
    )
    cwd: str | None = Field(
        default=None, description="stdio: working directory relative to the conversation workspace (default: it)."
    )
    url: str | None = Field(default=None, description="http: the streamable-HTTP endpoint, http:// or https://.")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="http: request headers; values may contain ${KEY} references, and secret-shaped names "
        "(Authorization, X-Api-Key, …) must use them.",
    )
    tools: list[str] | None = Field(default=None, description="The server's tools to offer; default all.")
    timeout_s: float = Field(default=60.0, gt=0, le=3600, description="Cap on one tool call.")
    network: bool = Field(default=False, description="stdio (local agent): let the server use the network.")
    ro_paths: list[str] = Field(
        default_factory=list,
        description="stdio (local agent): absolute paths the server's sandbox sees read-only (its install, a venv); "
        "the host checks them at bind time and shows them to the runner's sandbox.",
        json_schema_extra=path_setting("ro"),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not SERVER_NAME.match(name):
            raise ValueError(f"MCP server name {name!r} must be 1-32 chars of a-z 0-9 '_' '-'")
        return name

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not ENV_NAME.match(name) or name in RESERVED_ENV:
                raise ValueError(f"env {name!r} cannot be set for an MCP server")
            _check_value(f"env {name}", name, value)
        return env

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            _check_value(f"header {name}", name, value)
        return headers

    @field_validator("args")
    @classmethod
    def _args(cls, args: list[str]) -> list[str]:
        for arg in args:
            if "\0" in arg:
                raise ValueError("an argument contains a NUL byte")
        return args

    @field_validator("ro_paths")
    @classmethod
    def _ro_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or path.rstrip("/") == "" or ".." in PurePosixPath(path).parts:
                raise ValueError(f"ro_paths entry {path!r} must be an absolute path other than /, without '..'")
        return paths

    @model_validator(mode="after")
    def _transport_fields(self) -> McpServer:
        if self.transport == "stdio":
            if not self.command or "\0" in self.command:
                raise ValueError(f"MCP server {self.name!r}: a stdio server needs a command")
            if self.url is not None or self.headers:
                raise ValueError(f"MCP server {self.name!r}: url and headers are for http servers")
            if self.cwd is not None:
                p = PurePosixPath(self.cwd)
                if p.is_absolute() or ".." in p.parts or "\0" in self.cwd:
                    raise ValueError(f"MCP server {self.name!r}: cwd must be relative to the workspace, without '..'")
        else:
            if self.url is None:
                raise ValueError(f"MCP server {self.name!r}: an http server needs a url")
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
                raise ValueError(
                    f"MCP server {self.name!r}: url must be http:// or https:// with a host (and no credentials "
                    "in it: use headers with a ${KEY} reference)"
                )
            if self.command is not None or self.args or self.env or self.cwd is not None or self.ro_paths:
                raise ValueError(f"MCP server {self.name!r}: command, args, env, cwd and ro_paths are for stdio")
            if self.network:
                raise ValueError(f"MCP server {self.name!r}: network is for stdio servers")
        return self

    def references(self) -> list[str]:
        """The binding keys this server's env and headers refer to, sorted."""
        found = {m for v in (*self.env.values(), *self.headers.values()) for m in REFERENCE.findall(v)}
        return sorted(found)

    def resolved_env(self, secrets: Mapping[str, str]) -> dict[str, str]:
        return {k: resolve(v, secrets, f"mcp_servers[{self.name}].env.{k}") for k, v in self.env.items()}

    def resolved_headers(self, secrets: Mapping[str, str]) -> dict[str, str]:
        return {k: resolve(v, secrets, f"mcp_servers[{self.name}].headers.{k}") for k, v in self.headers.items()}


def _check_value(where: str, name: str, value: str) -> None:
    if "\0" in value or "\r" in value or "\n" in value:
        raise ValueError(f"{where} contains a control character")
    if SECRET_NAME.search(name) and not REFERENCE.search(value):
        raise ValueError(
            f"{where} looks like a credential, and binding configs are stored in the clear: store the value with "
            "`agenthost keys set NAME`, add NAME to the binding's keys, and write ${NAME} here"
        )


def resolve(value: str, secrets: Mapping[str, str], where: str) -> str:
    """`value` with each ${KEY} replaced by the binding's key; McpServerError naming the first missing one."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in secrets:
            raise McpServerError(
                f"{where} refers to key {name!r}, which this binding's keys do not include (store it with "
                f"`agenthost keys set {name}` and add it to the binding's keys)"
            )
        return secrets[name]

    return REFERENCE.sub(one, value)


def check_unique(servers: list[McpServer], *, reserved: tuple[str, ...] = ()) -> list[McpServer]:
    """The list-level rules: at most MAX_SERVERS, unique names, none of the runner's own server names."""
    if len(servers) > MAX_SERVERS:
        raise ValueError(f"at most {MAX_SERVERS} MCP servers per binding")
    names = [s.name for s in servers]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate MCP server names {dupes}")
    taken = sorted(set(names) & set(reserved))
    if taken:
        raise ValueError(f"MCP server name(s) {taken} are reserved for the runner's own server")
    return servers


def ro_path_problems(server: McpServer, data_dir: Path) -> list[str]:
    """ro_paths may not reach the runner's data dir (sessions, every conversation's workspace) nor contain it."""
    data = data_dir.resolve()
    problems = []
    for raw in server.ro_paths:
        path = Path(raw).resolve()
        if path == data or data in path.parents or path in data.parents:
            problems.append(
                f"mcp_servers[{server.name}].ro_paths: {raw} overlaps the runner's data dir, which holds every "
                "conversation's workspace and session"
            )
    return problems
