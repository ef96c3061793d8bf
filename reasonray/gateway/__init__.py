"""The LLM gateway: the narrow LLM protocol, the OpenAI-compatible client, token counting, retries,
the circuit breaker, the response cache policy and the simulated model. Imports nothing of ours."""
