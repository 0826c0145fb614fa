"""Provider keys (`agenthost keys set NAME`), kept in `<data>/keys.json` (0600), never in the database and never
returned by any API. A binding names the keys its runner may have (`resource_policy.keys`); the host reads the
file when a run starts, so a key set on a running host reaches the next run without a restart, and only the runs
of bindings that name it ever receive it (RunRequest.secrets, over the runner's own socket).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from agenthost.host.access.private_files import read_json, write_json
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb

KEYS_FILE = "keys.json"
MAX_KEY_CHARS = 16 * 1024
# Environment-variable style, since runners look keys up under the names providers document (OPENAI_API_KEY).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise errors.InvalidArgument(f"key name {name[:64]!r}: letters, digits and '_', not starting with a digit")
    return name


class KeyStore:
    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / KEYS_FILE

    def _load(self) -> dict[str, dict[str, object]]:
        return (read_json(self._path) or {}).get("keys", {})

    def set(self, name: str, value: str) -> hpb.KeyInfo:
        check_name(name)
        if not value or len(value) > MAX_KEY_CHARS or value != value.strip():
            raise errors.InvalidArgument(
                f"key value must be 1-{MAX_KEY_CHARS} characters without leading or trailing whitespace"
            )
        keys = self._load()
        keys[name] = {"value": value, "updated_at": time.time()}
        write_json(self._path, {"keys": keys})
        return self._info(name, keys[name])

    def remove(self, name: str) -> None:
        keys = self._load()
        if keys.pop(check_name(name), None) is None:
            raise errors.NotFound(f"no key {name!r}")
        write_json(self._path, {"keys": keys})

    def list(self) -> list[hpb.KeyInfo]:
        return [self._info(n, k) for n, k in sorted(self._load().items())]

    def resolve(self, names: list[str]) -> dict[str, str]:
        """The values of `names` for one run. A name the store lacks is an error the run reports, since a binding
        that names a key expects it."""
        if not names:
            return {}
        keys = self._load()
        missing = [n for n in names if n not in keys]
        if missing:
            raise errors.FailedPrecondition(
                f"the binding names key(s) {missing} that the host does not have; "
                "set them with `agenthost keys set NAME`"
            )
        return {n: str(keys[n]["value"]) for n in names}

    @staticmethod
    def _info(name: str, key: dict[str, object]) -> hpb.KeyInfo:
        return hpb.KeyInfo(name=name, updated_at=float(key["updated_at"]), length=len(str(key["value"])))
