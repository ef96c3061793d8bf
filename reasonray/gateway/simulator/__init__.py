"""The simulated model: a deterministic, OpenAI-compatible HTTP server for tests, benchmarks and demos."""
