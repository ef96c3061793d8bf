"""The kernel: configuration, the error tree, events, tags, telemetry, storage and the sandbox. Imports nothing else of ReasonRay."""
