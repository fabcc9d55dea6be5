"""Environments realrl ships for multi-turn rollouts (``env=<name>``).

Importing this package registers nothing: ``realrl.impl.builtin`` imports each environment's
module, which registers it (as the reward functions and datasets do).
"""
