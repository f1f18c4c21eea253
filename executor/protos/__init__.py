"""The worker protocol (`worker.proto`, package `autoscaler.worker.v1`) and its generated stubs.

The stubs are committed; after editing the .proto, regenerate them with
`python -m executor.protos` (needs grpcio-tools, a dev dependency). A test
regenerates them and fails if the committed ones differ.
"""
