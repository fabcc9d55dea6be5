"""benchmarks/bench_algorithms.py's ``--group verl`` at tiny sizes (``--smoke``: a loss through its
preset and an estimator that reads the rollout's log-probs), and its refusals."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from test_bench_smoke import NUMBER, REPO, run_bench, table_rows


def test_bench_algorithms_verl_group(tmp_path, sentiment_runs):
    out = run_bench("bench_algorithms.py", tmp_path, "--group", "verl", "--fileroot", sentiment_runs)
    for label in ("cispo", "adv_optimal_token_baseline"):
        ((_, *cells),) = table_rows(out, label)
        assert len(cells) == 6 and all(re.match(NUMBER, c) for c in cells), cells


def test_bench_algorithms_refuses_an_unknown_group_task_or_label():
    script = os.path.join("benchmarks", "bench_algorithms.py")
    for args, message in (
        (["--task", "arith", "--group", "verl"], "--group verl has no runs on --task arith"),
        (["--group", "verl", "--only", "grpo"], "no such label in --group verl: grpo"),
    ):
        done = subprocess.run([sys.executable, script, *args], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
