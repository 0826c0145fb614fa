// gRPC's standard health service (grpc.health.v1), served from code generated from its health.proto: the
// supervisor waits for SERVING before it hands the process a run, and NOT_SERVING says it is going away.
import { type Server, type ServerWritableStream, status } from "@grpc/grpc-js";
import {
  type HealthCheckRequest,
  type HealthCheckResponse,
  HealthCheckResponse_ServingStatus as ServingStatus,
  type HealthServer,
  HealthService,
} from "./gen/grpc/health/v1/health";

export { ServingStatus };

export class Health {
  private readonly statuses = new Map<string, ServingStatus>();
  private readonly watchers = new Map<string, Set<ServerWritableStream<HealthCheckRequest, HealthCheckResponse>>>();

  set(service: string, value: ServingStatus): void {
    this.statuses.set(service, value);
    for (const call of this.watchers.get(service) ?? []) call.write({ status: value });
  }

  /** Every service NOT_SERVING, for good: the process is going away. */
  enterGracefulShutdown(): void {
    for (const service of this.statuses.keys()) this.set(service, ServingStatus.NOT_SERVING);
  }

  addTo(server: Server): void {
    const impl: HealthServer = {
      check: (call, callback) => {
        const value = this.statuses.get(call.request.service);
        if (value === undefined) callback({ code: status.NOT_FOUND, details: `unknown service ${call.request.service}` });
        else callback(null, { status: value });
      },
      watch: (call) => {
        const service = call.request.service;
        call.write({ status: this.statuses.get(service) ?? ServingStatus.SERVICE_UNKNOWN });
        let set = this.watchers.get(service);
        if (!set) this.watchers.set(service, (set = new Set()));
        set.add(call);
        call.on("cancelled", () => set!.delete(call));
      },
      list: (_call, callback) => {
        const statuses: Record<string, HealthCheckResponse> = {};
        for (const [service, value] of this.statuses) statuses[service] = { status: value };
        callback(null, { statuses });
      },
    };
    server.addService(HealthService, impl);
  }
}
