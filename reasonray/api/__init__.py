"""The API layer: the method table and the surfaces that serve it (JSON-RPC, REST mirrors)."""
