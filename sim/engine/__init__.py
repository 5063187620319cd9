"""The discrete-event engine: the costs it reads, the transports it models, the result it records."""
