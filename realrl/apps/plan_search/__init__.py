"""Execution-plan search: which layout and workers each model function call gets, chosen by
replaying the dataflow graph in simulated time under every plan (docs/plan_search.md).

- ``space.py``: the plans considered (a placement per call) and a plan as an ``allocation_mode``.
- ``simulator.py``: a step's seconds under a plan, with the master's own rules
  (``system.version_rule``, ``system.copies``), from ``Costs``.
- ``cost_table.py``: the measured costs, one point per batch shape, cached and interpolated.
- ``profiles.py``: the short runs that fill that table (calls, moves, contention, plans run briefly).
- ``paper_costs.py``: costs from FLOPs, bytes and a device's datasheet instead (nothing runs).
- ``search.py``: every plan simulated, or a Metropolis walk over them; memory-checked.
- ``choose.py``: the calls costed, the plans searched, the best predicted run briefly: the plan to run.

``python -m realrl.apps.search`` (the command) and ``allocation_mode=search`` call ``choose``.
The package sits in apps: its profiles launch short runs of the experiment and its simulator
reuses the system's scheduling rules, so it imports base, api, impl and system, and nothing
below apps imports it. Model sizes and stage cuts come from ``realrl.api.core.model_size``, a
plan's memory from ``realrl.api.quickstart.memory_plan``.
"""
