"""Pure decision code: routing policies and scaling policies."""
