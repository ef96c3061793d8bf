"""The client tool the session tests hand off (a weather lookup the caller runs, not the service), and the steps of
a turn that ran a server tool, handed a client call off and was resumed with its result."""

from __future__ import annotations

from typing import Any

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# the calculator, then the hand-off (exit mode 2), then the re-entry with the client's result and the answer
HANDED_OFF_THEN_RESUMED = [
    "TURN_STARTED",
    "LLM_CALL",
    "TOOL_EXECUTED",
    "LLM_CALL",
    "CLIENT_TOOL_PENDING",
    "EXIT",
    "REENTRY_VERIFIED",
    "CONTINUATION",
    "LLM_CALL",
    "EXIT",
]
