"""The run path: admission, routing, recording, streaming, child runs and approvals of one run."""
