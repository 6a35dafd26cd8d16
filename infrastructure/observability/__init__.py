"""Operators' signals in their ecosystem's own formats: Prometheus, structured logs."""
