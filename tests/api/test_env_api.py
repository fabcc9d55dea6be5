"""The environment protocol of multi-turn rollouts: environments named three ways, plain and
asynchronous steps run side by side, and every way a user's environment can go wrong stopping the
run with a message that names it and the sample."""

from __future__ import annotations

import math
import textwrap
import time

import pytest

from realrl.api.core.env_api import EnvError, EnvStep, make_env, register_env, resolve_env, step_all


class Echo:
    """Says back what the model said, rewarding its length; done on "stop"."""

    def __init__(self, prompt: str, bonus: float = 0.0, **metadata):
        self.prompt, self.bonus, self.metadata = prompt, bonus, metadata

    def step(self, completion: str):
        return f"you said {completion}", len(completion) + self.bonus, completion == "stop"


class SlowAsync:
    def __init__(self, prompt: str, delay: float = 0.3):
        self.delay = delay

    async def step(self, completion: str):
        import asyncio

        await asyncio.sleep(self.delay)
        return None, 1.0, True


def test_an_environment_is_named_by_registration_module_or_file(tmp_path):
    register_env("test-echo", Echo)
    assert resolve_env("test-echo") is Echo
    assert resolve_env(f"{__name__}:Echo") is Echo
    path = tmp_path / "my_env.py"
    path.write_text(
        textwrap.dedent(
            """
            class Counter:
                def __init__(self, prompt, **metadata):
                    self.n = 0
                def step(self, completion):
                    self.n += 1
                    return str(self.n), 0.5, self.n == 2
            """
        )
    )
    cls = resolve_env(f"{path}:Counter")
    env = make_env(cls, "p", {}, {}, sample=0)
    assert step_all([env], ["a"], [0], timeout=5) == [EnvStep("1", 0.5, False)]
    assert step_all([env], ["b"], [0], timeout=5) == [EnvStep("2", 0.5, True)]  # one instance per trajectory
    with pytest.raises(EnvError, match="no such file"):
        resolve_env(f"{tmp_path}/missing.py:Counter")
    with pytest.raises(EnvError, match="not a class"):
        resolve_env(f"{__name__}:test_an_environment_is_named_by_registration_module_or_file")
    with pytest.raises(LookupError, match="test-echo"):  # an unknown name lists the registered ones
        resolve_env("no-such-env")


def test_metadata_then_env_kwargs_reach_the_constructor_and_steps_run_at_once():
    env = make_env(Echo, "2+2=?", {"answer": "4"}, {"bonus": 1.0}, sample="s0")
    assert (env.prompt, env.bonus, env.metadata) == ("2+2=?", 1.0, {"answer": "4"})
    slow = [SlowAsync("p") for _ in range(4)]
    start = time.monotonic()
    steps = step_all([env, *slow], ["stop", "a", "b", "c", "d"], list(range(5)), timeout=5)
    assert time.monotonic() - start < 1.0  # four 0.3 s waits side by side, not one after another
    assert steps[0] == EnvStep("you said stop", 5.0, True) and all(
        s == EnvStep(None, 1.0, True) for s in steps[1:]
    )


class Raises:
    def __init__(self, prompt: str):
        pass

    def step(self, completion: str):
        raise ZeroDivisionError("the tool divided by zero")


class Hangs:
    def __init__(self, prompt: str):
        pass

    def step(self, completion: str):
        time.sleep(2)


class Returns:
    def __init__(self, prompt: str, value=None):
        self.value = value

    def step(self, completion: str):
        return self.value


def test_what_a_broken_environment_does_stops_the_run_naming_it_and_the_sample():
    start = time.monotonic()
    with pytest.raises(EnvError, match=r"Raises\.step raised ZeroDivisionError.*samples \['id7'\]") as e:
        step_all([Raises("p")], ["x"], ["id7"], timeout=5)
    assert "Traceback" in str(e.value) and "the tool divided by zero" in str(e.value)
    with pytest.raises(
        EnvError, match=r"Hangs\.step gave no answer within env_timeout=0.2 s \(sample 'id8'\)"
    ):
        step_all([Hangs("p")], ["x"], ["id8"], timeout=0.2)
    assert time.monotonic() - start < 1.5  # the hung thread is left behind, not waited for
    with pytest.raises(EnvError, match="SlowAsync.step gave no answer"):
        step_all([SlowAsync("p", delay=2)], ["x"], ["id9"], timeout=0.2)
    for value, what in [
        (None, "expected \\(observation, reward, done\\)"),
        (("obs", math.nan, False), "reward nan: expected a finite number"),
        (("obs", 1.0, "yes"), "done 'yes'"),
        ((3, 1.0, True), "observation 3"),
    ]:
        with pytest.raises(EnvError, match=what):
            step_all([Returns("p", value)], ["x"], ["id"], timeout=5)
    with pytest.raises(EnvError, match=r"Returns.__init__ raised TypeError"):
        make_env(Returns, "p", {"unexpected": 1}, {}, sample="id")
