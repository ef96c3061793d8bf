"""Reasoning strategies behind one `ReasoningStrategy` protocol, one strategy per module, plus the
registry that discovers them through the `reasonray.strategies` entry-point group."""
