import os
import sys

# the runtime tests' helpers (mock graphs and plugins, worker pids, kill helpers) serve these too
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "system"))
