"""benchmarks/bench_rollout_correction.py at tiny sizes (``--smoke``): GRPO with a decoder at
another temperature than the trainer, uncorrected and with token-level importance sampling; the
corrected arm measures the mismatch and weighs its tokens, and every cell holds a figure."""

from __future__ import annotations

import json
import re

from test_bench_smoke import NUMBER, run_bench, table_rows


def test_bench_rollout_correction(tmp_path, sentiment_runs):
    out = run_bench("bench_rollout_correction.py", tmp_path, "--fileroot", sentiment_runs)
    rows = {r["label"]: r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}
    assert set(rows) == {"mismatch", "mismatch_token_is"}, rows
    assert rows["mismatch"]["k3_kl"] is None  # no recomputation: nothing measured
    corrected = rows["mismatch_token_is"]
    assert corrected["k3_kl"] > 1e-3 and 0 < corrected["is_weight"] <= 2, corrected
    ((_, *cells),) = table_rows(out, "mismatch_token_is")
    assert len(cells) == 6 and all(re.match(NUMBER, c) for c in cells), cells
