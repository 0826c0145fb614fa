// agenthost's runner SDK for TypeScript: everything a runner plugin author imports.
//
//   import { Runner, RunContext, events, main } from "@agenthost/runner-sdk";
export { RunAPI, type Direction } from "./api";
export { ChildRun, type ChildRunOptions } from "./child";
export * as errors from "./errors";
export * as events from "./events";
export type { RunEvent, Scope } from "./events";
export { main, readConfigLine, hostStop } from "./plugin";
export { RunContext, Runner, sleep, type RunnerClass, type RunnerManifest } from "./runner";
export { batching, serve, SDK_VERSION, type ServeOptions } from "./server";
export * as wire from "./wire";
export type { ArtifactRef, EventRecord, TranscriptItem } from "./gen/agenthost/protos/common";
export type {
  ApprovalDecision,
  ArtifactChunk,
  ChildRunFinished,
  EventPageResponse,
  HistoryPageResponse,
  KbSearchResponse,
  StateListResponse,
  StateValue,
} from "./gen/agenthost/protos/run_api";
export type { AgentRunContext } from "./gen/agenthost/protos/runner";
