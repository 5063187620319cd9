"""The small models exec trains: their spec and layers (`spec`), and how they are cut into stages (`cuts`)."""
