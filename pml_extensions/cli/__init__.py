"""The command line: ``python -m pml_extensions {job,run,explain}``."""
