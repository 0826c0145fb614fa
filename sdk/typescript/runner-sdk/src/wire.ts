// The wire contract beyond the .proto files, as agenthost's protos/wire.py states it (tests/test_typescript_sdk.py
// checks that every value here equals the Python one).

/** A plugin process announces itself on stdout with `AGENTHOST|<PROTOCOL_VERSION>|<address>`. */
export const PROTOCOL_VERSION = 1;
export const HANDSHAKE_PREFIX = "AGENTHOST";
/** Symmetric on every channel and server: a message either side may send, the other may receive. */
export const MAX_MESSAGE_BYTES = 8 * 1024 * 1024;
/** A run's event batch is cut at this many events and bytes. */
export const MAX_BATCH = 256;
export const MAX_BATCH_BYTES = 4 * 1024 * 1024;
/** The largest single event a runner may emit; a larger one ends the run with `event_too_large`. */
export const MAX_EVENT_BYTES = MAX_MESSAGE_BYTES - 64 * 1024;
/** A text delta of 1 to SHORT_TEXT_BYTES bytes of UTF-8 is framed with one-byte lengths. */
export const SHORT_TEXT_BYTES = 123;
/** The gRPC health service name a runner process reports SERVING under. */
export const RUNNER_HEALTH_SERVICE = "agenthost.v1.Runner";
/** How long an approval request waits when the runner names no timeout. */
export const APPROVAL_DEFAULT_SECONDS = 300.0;

/** The process exit codes of the spawn protocol (agenthost.plugins.plugin_process, agenthost.runners.sdk). */
export const EXIT_BAD_CONFIG = 2;
export const EXIT_DISCOVERY = 3;
export const EXIT_UNAVAILABLE = 4;

export const CHANNEL_OPTIONS = {
  "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
  "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
};
