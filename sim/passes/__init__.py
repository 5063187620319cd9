"""Passes over a `Schedule`: dependencies, validation and lowering, and the passes that add actions."""
