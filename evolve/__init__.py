"""evolve package."""
