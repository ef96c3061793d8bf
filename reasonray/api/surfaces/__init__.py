"""How callers reach the API: the HTTP front door, JSON-RPC streaming, the OpenAI, MCP and A2A surfaces, the OpenRPC document, request spans and the Prometheus page."""
