"""Reads: query functions that shape data for the API and the dashboard."""
