"""Layer 1: the contracts every implementation and runtime part agrees on."""
