"""benchmarks/paper_weight_push.py prints its on-paper table: a row per actor whose bytes are its
parameters' bf16 size and whose push over InfiniBand is slower than over NVLink by the links'
ratio."""

from __future__ import annotations

import re

from test_bench_smoke import run_bench, table_rows


def test_paper_weight_push(tmp_path):
    out = run_bench("paper_weight_push.py", tmp_path, timeout=120)
    ((_, gb, replica, nvlink, ib, _),) = table_rows(out, "llama-2-7b")
    assert 13.0 < float(gb) < 14.0 and replica.startswith("TP 1")  # 6.74B parameters, 2 bytes each
    nv_s = float(re.match(r"([\d.]+) ms", nvlink).group(1)) / 1e3
    ib_s = float(re.match(r"([\d.]+) s", ib).group(1))
    assert abs(ib_s / nv_s - 9.0) < 0.5  # 450 GB/s of NVLink against 50 GB/s of one NIC
    assert table_rows(out, "qwen2.5-32b") and table_rows(out, "llama-2-70b")
    assert "NeMo-RL refit" in out
