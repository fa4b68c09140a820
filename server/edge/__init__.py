"""The gRPC and HTTP edges: services, interceptors, status mapping, auth."""
