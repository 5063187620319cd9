"""Cost-aware searches: the automatic zero-bubble schedule and the balanced partition of layers."""
