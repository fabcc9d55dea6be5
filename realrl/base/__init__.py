"""Layer 0: utilities with no knowledge of models or algorithms."""
