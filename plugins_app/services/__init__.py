"""Writes and actions. Views, API and commands call these; they call models, bus, events and the engine."""
