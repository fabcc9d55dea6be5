"""benchmarks/bench_train.py --compile at tiny sizes (``--smoke``): the TrainEngine with its blocks
compiled trains beside the eager one, computes the same first-step loss, and reports its
throughput, the ratio and the one-off compile seconds; and bench_forward.py --compile, the packed
forward and backward with compiled blocks beside the eager one and transformers'. Compiling takes
tens of seconds on a loaded CPU, so these run under ``-m slow``; the plain scripts' smoke tests
run by default."""

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


@pytest.mark.slow
def test_bench_forward_compile(tmp_path):
    out = run_bench("bench_forward.py", tmp_path, "--device", "cpu", "--compile", timeout=600)
    ((wall, cpu),) = figures(rf"^ReaLModel compiled fwd\+bwd\s+({NUMBER})\s+({NUMBER})$", out)
    assert float(wall) > 0 and float(cpu) > 0, out
    for versus in ("ReaLModel", "HF"):
        figures(rf"^ratio \(compiled / {versus}\)\s+({NUMBER})x\s+({NUMBER})x$", out)
    ((seconds, graphs),) = figures(rf"^one-off compile: ({NUMBER}) s \(first step, ({NUMBER}) graphs\)$", out)
    assert float(seconds) > 0 and int(graphs) > 0, out
