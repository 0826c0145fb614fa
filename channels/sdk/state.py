"""An adapter's own durable state: one small JSON document in its data dir, replaced atomically (write, fsync,
rename) so a crash leaves the old or the new document, never half of one. What a channel keeps here is what must
survive a restart: the platform's update high-water mark, conversation generations (`/new`), a message in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


class AdapterState:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            loaded = json.loads(path.read_text())
        except FileNotFoundError:
            loaded = {}
        except ValueError:
            # A torn or corrupted file cannot come from save(); keep it for a person, start afresh.
            path.replace(path.with_suffix(".corrupt"))
            loaded = {}
        self.data: dict[str, Any] = loaded if isinstance(loaded, dict) else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def save(self, **changes: Any) -> None:
        """Applies `changes` (a None value removes the key) and makes them durable before returning."""
        for key, value in changes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.data, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
