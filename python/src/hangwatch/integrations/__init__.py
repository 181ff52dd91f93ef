"""Framework callbacks; each submodule imports its framework, so import only the one you use."""
