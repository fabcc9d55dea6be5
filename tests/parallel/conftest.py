import os
import sys

# the model tests' fixtures (tiny configs, HF models of every family) serve these tests too
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))
