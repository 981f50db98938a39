"""A pack whose dependency is missing: it must be reported and skipped."""

import mg_dependency_that_does_not_exist  # noqa: F401

NODE_CLASS_MAPPINGS = {}
