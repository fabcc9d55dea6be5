"""benchmarks/bench_opd.py end to end at tiny sizes (``--smoke``): the teacher is built (its SFT
and GRPO), the student distilled from it and trained by GRPO, and the report's row holds a
figure in every cell."""

from __future__ import annotations

import json
import re

from test_bench_smoke import NUMBER, run_bench, table_rows


def test_bench_opd(tmp_path, sentiment_runs):
    out = run_bench("bench_opd.py", tmp_path, "--fileroot", sentiment_runs, timeout=600)
    ((_, *cells),) = table_rows(out, "1")
    assert len(cells) == 9, cells
    assert re.fullmatch(r"\d+k vs \d+k", cells[0]), cells
    teacher_k, student_k = (int(x) for x in re.findall(r"\d+", cells[0]))
    assert 3.5 < teacher_k / student_k < 4.5  # the default teacher: about 4x the student
    assert all(re.match(NUMBER, c) for c in cells[1:8]), cells
    (row,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert row["teacher_rl_steps"] == row["opd_steps"] == row["grpo_steps"] == 2
    assert row["kl_before"] >= 0 and row["kl_after"] >= 0
