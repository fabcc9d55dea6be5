"""Layer 2: implementations. Importing this package registers them by name."""
