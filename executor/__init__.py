"""Executor bindings: worker agent (gRPC + Docker), daemon-side client, throughput reporter."""
