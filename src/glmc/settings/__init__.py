"""What every alignment method can be set to, declared once with each setting's range (ranges.py), in groups
several methods share (groups.py) and per method (methods.py). It imports no matcher, torch or glmc.config,
so that the config schema and the matchers can both read it."""
