"""benchmarks/bench_search_wall.py end to end at tiny sizes (``--smoke``: sft on one worker, one
profile run): the search command's wall time, cold, with its prerequisites cached and with
everything cached, each beside its time limit as a ratio. The figures mean nothing here; the
table's shape and the runs each case did do."""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUMBER = r"\d+(?:\.\d+)?"


def test_bench_search_wall(tmp_path):
    argv = [sys.executable, os.path.join("benchmarks", "bench_search_wall.py"), "--smoke"]
    argv += ["--fileroot", str(tmp_path / "root")]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    out = done.stdout
    assert "sft search on 1 workers, search.time_limit_s=120" in out, out
    runs = {}
    for label in ("cold", "prerequisites cached", "all cached"):
        row = re.search(
            rf"^\| {label} \| ({NUMBER}) \| ({NUMBER}) \| (-?{NUMBER}) \| 120 \| (-?{NUMBER})x \| (\d+) \| (\d+) \|$",
            out,
            flags=re.MULTILINE,
        )
        assert row, out
        wall, phases, after, ratio, done_runs, skipped = row.groups()
        assert float(wall) > 0 and float(phases) == 0.0  # sft builds on no phase
        assert abs(float(ratio) - float(after) / 120) < 0.01
        runs[label] = (int(done_runs), int(skipped))
    # one layout on one worker: profiled when cold and again without its profile; then cached
    assert runs == {"cold": (1, 0), "prerequisites cached": (1, 0), "all cached": (0, 0)}, out
