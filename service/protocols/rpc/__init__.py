"""KServe v2 over gRPC: the proto, its generated messages, and the service (service.rpc.server)."""
