"""Layer 2: implementations. ``import realrl.impl.builtin`` registers them all by name (workers
do); importing this package or one of its modules alone registers only what that module defines."""
