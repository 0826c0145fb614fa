"""Operations: structured logs, Prometheus metrics, OTLP traces."""
