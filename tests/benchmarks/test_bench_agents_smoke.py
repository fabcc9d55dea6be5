"""benchmarks/bench_agents.py at tiny sizes (``--smoke``): both rollouts run, and the report gives
each one's figures and agent / env side by side (their values mean nothing at these sizes)."""

from __future__ import annotations

import re

import pytest
from test_bench_smoke import NUMBER, figures, run_bench, table_rows

pytest.importorskip("openai")
pytest.importorskip("aiohttp")


def test_bench_agents(tmp_path):
    out = run_bench("bench_agents.py", tmp_path, "--fileroot", str(tmp_path / "root"))
    figures(r"^2 prompts x 2 answers = 4 trajectories a step", out)
    for label in ("1", "mean"):
        ((_, *cells),) = table_rows(out, label)
        assert len(cells) == 11, cells
        seconds, turns = cells[:9], cells[9:]
        for env, agent, ratio in zip(seconds[::3], seconds[1::3], seconds[2::3]):
            assert float(env) > 0 and float(agent) > 0 and re.fullmatch(rf"{NUMBER}x", ratio), cells
        # the retry task: one or two model turns a trajectory, both ways
        assert all(1.0 <= float(t) <= 2.0 for t in turns), cells
    ((ratio, wall, env, cpu),) = figures(
        rf"^agent / env per step: ({NUMBER})x wall \(({NUMBER}) s against ({NUMBER}) s\), ({NUMBER})x CPU$",
        out,
    )
    assert float(ratio) > 0 and float(wall) > 0 and float(env) > 0 and float(cpu) > 0
    ((calls,),) = figures(rf"^agent generate calls a step: ({NUMBER})$", out)
    assert 1.0 <= float(calls) <= 2.0  # one batch a turn: every agent's request in it
    ((client, asks, floor),) = figures(
        rf"^the OpenAI client alone: ({NUMBER}) ms CPU a completion x ({NUMBER}) = {NUMBER} s CPU a step; "
        rf"with the environment's {NUMBER} s, a floor of ({NUMBER})x CPU$",
        out,
    )
    assert float(client) > 0 and 4 <= float(asks) <= 8 and float(floor) > 1.0
