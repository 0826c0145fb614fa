"""Typed errors of the external-harness runners.

Each carries the `code` the run's `failed` event reports, so a caller can tell bad configuration (fix the
binding) from a harness that broke (look at its stderr) from an exhausted deadline (retry later).
"""

from __future__ import annotations


class HarnessError(Exception):
    code = "harness_error"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HarnessConfigError(HarnessError):
    """The binding config (or the runner's environment) cannot drive a harness: unknown binary, bad skill, ..."""

    code = "harness_config"


class HarnessNotFound(HarnessConfigError):
    """The harness executable does not exist or is not executable."""

    code = "harness_not_found"


class HarnessCrashed(HarnessError):
    """The harness exited without a result; the message carries the tail of its stderr."""

    code = "harness_crashed"


class HarnessReportedError(HarnessError):
    """The harness finished and said the turn failed (`is_error`, an error subtype, `turn.failed`)."""

    def __init__(self, message: str, *, code: str = "harness_error", retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class ProjectionError(HarnessConfigError):
    """Something refused to be projected into the working directory (a path escaping it, a bad name)."""

    code = "projection_error"


class HarnessSandboxError(HarnessError):
    """The harness cannot be walled in here (no working bubblewrap, or a layout that would expose the runner's
    data dir); the run is refused rather than started without walls."""

    code = "harness_sandbox"


class WorkspaceQuotaError(HarnessError):
    """The conversation's working directory and harness home passed `workspace_max_mib`: the message says how much
    and what to do."""

    code = "workspace_quota"
