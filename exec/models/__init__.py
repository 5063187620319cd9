"""The small models exec trains: their spec and layers (`spec`, `layers`, `moe` for a mixture of experts), and how they are cut into stages (`cuts`)."""
