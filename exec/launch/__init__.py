"""Processes: one per rank, bounded in time (`processes`), and the host tuning that gives each CPU rank cores of its own (`host`)."""
