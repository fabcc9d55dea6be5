"""benchmarks/bench_mismatch.py at tiny sizes (``--smoke``): two families through the model API
and one quickstart run with ``ppo.recompute_logprobs=true``; in fp32 the decoder and the trainer
agree to float rounding, and decoding in bf16 is measurably further off."""

from __future__ import annotations

from test_bench_smoke import is_number, run_bench, table_rows


def test_bench_mismatch(tmp_path, sentiment_runs):
    out = run_bench("bench_mismatch.py", tmp_path, "--layouts", "0", "--fileroot", sentiment_runs)
    for family in ("llama", "mixtral"):
        rows = {cells[1]: cells[2:] for cells in table_rows(out, family)}
        assert set(rows) == {"fp32", "bf16", "bf16 decode, fp32 train"}, rows
        assert all(is_number(c) for cells in rows.values() for c in cells), rows
        k1, k3, max_abs, tokens = (float(c) for c in rows["fp32"])
        assert tokens > 0 and abs(k1) < 1e-5 and abs(k3) < 1e-8 and max_abs < 1e-4, rows
        assert float(rows["bf16 decode, fp32 train"][2]) > 10 * max_abs, rows
    ((_, k1, k3, max_abs),) = table_rows(out, "one process, fp32")
    assert abs(float(k1)) < 1e-5 and abs(float(k3)) < 1e-8 and float(max_abs) < 1e-4, out
