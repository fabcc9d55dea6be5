"""benchmarks/bench_train.py --compile at tiny sizes (``--smoke``): the TrainEngine with its blocks
compiled trains beside the eager one, computes the same first-step loss, and reports its
throughput, the ratio and the one-off compile seconds. Compiling takes tens of seconds on a loaded
CPU, so this runs under ``-m slow``; the plain script's smoke test runs by default."""

from __future__ import annotations

import pytest
from test_bench_smoke import NUMBER, figures, run_bench


@pytest.mark.slow
def test_bench_train_compile(tmp_path):
    out = run_bench("bench_train.py", tmp_path, "--compile", timeout=600)
    (compiled, eager), *_ = figures(rf"^first-step loss: compiled ({NUMBER})  eager ({NUMBER})$", out)
    assert abs(float(compiled) - float(eager)) < 1e-4, out
    figures(rf"^realrl TrainEngine compiled\s+({NUMBER}) tokens/s", out)
    ((ratio, _, seconds, graphs),) = figures(
        rf"^compile ratio compiled / eager: ({NUMBER})x wall-clock, ({NUMBER})x CPU time; "
        rf"one-off compile ({NUMBER}) s \(({NUMBER}) graphs\)$",
        out,
    )
    assert float(ratio) > 0 and float(seconds) > 0 and int(graphs) > 0, out
