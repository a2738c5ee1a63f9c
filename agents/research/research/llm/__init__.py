"""The model client: transport (TCP or Unix socket), SSE stream assembly, retries."""
