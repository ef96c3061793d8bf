"""Ray actors (strategy registry, LLM cache) and the Ray side of fan-out. No reasoning logic lives here."""

NAMESPACE = "reasonray"
