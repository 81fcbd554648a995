"""Where an object is built from a config's ``{ClassName: kwargs}`` specs."""
