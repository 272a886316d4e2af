"""dynamic_bench package."""
