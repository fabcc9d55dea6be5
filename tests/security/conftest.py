import os
import sys

# the runtime tests' helpers (mock graphs and plugins, worker pids) serve these too
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "system"))
