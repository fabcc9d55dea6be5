"""Environments of multi-turn rollouts: the Python protocol a user implements, and how it is called.

An environment is a class, one instance per trajectory: ``Env(prompt: str, **metadata)`` (the
dataset row's ``metadata_keys`` fields, then the experiment's ``env_kwargs``), and
``step(completion: str) -> (observation: str | None, reward: float, done: bool)``, plain or
``async def``. The model's turn is the completion; the observation (a tool's output, a user's
reply) is appended after it and the model continues, until the environment says done or a turn
or token budget ends the trajectory; its reward is the sum of its steps' rewards.

It is named by a ``register_env`` name, ``package.module:Class`` or ``path/to/file.py:Class``.
Whatever the user's code does wrong (an exception, no answer within the timeout, a value of the
wrong type, a reward that is not a finite number) becomes an ``EnvError`` carrying its traceback
and the samples it concerns: the run stops with it instead of training on garbage.

Steps of many trajectories run at once (``step_all``): asynchronous ones on one event loop,
plain ones each in a thread, so an environment that waits on a tool or a server does not hold
the others up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import math
import numbers
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from realrl.base.plugins import load_attribute
from realrl.base.registry import Registry


class Environment(Protocol):
    """What an environment class provides (its constructor: ``(prompt, **metadata)``)."""

    def step(self, completion: str) -> Any:  # (str | None, float, bool), or an awaitable of it
        ...


@dataclasses.dataclass(frozen=True)
class EnvStep:
    observation: str | None  # appended after the model's turn; None: nothing to add
    reward: float
    done: bool


class EnvError(RuntimeError):
    """The user's environment failed: the message names it, the samples and its traceback."""


_ENVS: Registry[type] = Registry("environment")


def register_env(name: str, cls: type) -> type:
    """Make ``env=<name>`` build ``cls``."""
    if not isinstance(cls, type):
        raise TypeError(f"register_env({name!r}, ...) takes a class, got {cls!r}")
    return _ENVS.register(name, cls)


def env_names() -> list[str]:
    return _ENVS.names()


def resolve_env(spec: str) -> type:
    """The class ``spec`` names: a registered name, ``module:Class`` or ``file.py:Class``."""
    if ":" not in spec:
        return _ENVS.get(spec)
    try:
        cls = load_attribute(spec)
    except Exception as e:  # noqa: BLE001 - re-raised naming the spec that failed
        raise EnvError(f"cannot load environment {spec!r}: {type(e).__name__}: {e}") from e
    if not isinstance(cls, type):
        raise EnvError(f"environment {spec!r} is {cls!r}, not a class")
    if not callable(getattr(cls, "step", None)):
        raise EnvError(f"environment {spec!r} has no step(completion) method")
    return cls


def make_env(
    cls: type, prompt: str, metadata: Mapping[str, Any], kwargs: Mapping[str, Any], sample: Any
) -> Any:
    """One trajectory's environment; the user's exception as an ``EnvError`` naming the sample."""
    try:
        return cls(prompt, **{**metadata, **kwargs})
    except Exception as e:  # noqa: BLE001 - the user's code: reported whole
        raise EnvError(_failure(cls, "__init__", [sample], e)) from e


def step_all(
    envs: Sequence[Any], completions: Sequence[str], samples: Sequence[Any], timeout: float
) -> list[EnvStep]:
    """``env.step(completion)`` of every trajectory at once, each within ``timeout`` seconds."""
    if not envs:
        return []
    # threads of their own, not waited for at the end: a step that never returns is reported,
    # and does not hold the run (or its shutdown) up
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=len(envs), thread_name_prefix="env-step")
    try:
        return asyncio.run(_step_all(envs, completions, samples, timeout, threads))
    finally:
        threads.shutdown(wait=False, cancel_futures=True)


async def _step_all(envs, completions, samples, timeout: float, threads) -> list[EnvStep]:
    steps = (_one(e, c, s, timeout, threads) for e, c, s in zip(envs, completions, samples, strict=True))
    return list(await asyncio.gather(*steps))


async def _one(env: Any, completion: str, sample: Any, timeout: float, threads) -> EnvStep:
    cls = type(env)
    try:
        if inspect.iscoroutinefunction(env.step):
            result = await asyncio.wait_for(env.step(completion), timeout)
        else:
            in_thread = asyncio.get_running_loop().run_in_executor(threads, env.step, completion)
            result = await asyncio.wait_for(in_thread, timeout)
            if inspect.isawaitable(result):  # a plain method that returned a coroutine
                result = await asyncio.wait_for(result, timeout)
    except TimeoutError:
        raise EnvError(
            f"environment {_name(cls)}.step gave no answer within env_timeout={timeout:g} s (sample {sample!r})"
        ) from None
    except Exception as e:  # noqa: BLE001 - the user's code: reported whole
        raise EnvError(_failure(cls, "step", [sample], e)) from e
    return check_step(result, cls, sample)


def check_step(result: Any, cls: type, sample: Any) -> EnvStep:
    """``(observation, reward, done)`` with a finite reward, or an ``EnvError`` saying what came."""
    where = f"environment {_name(cls)}.step (sample {sample!r})"
    if not isinstance(result, tuple | list) or len(result) != 3:
        raise EnvError(f"{where} returned {result!r}: expected (observation, reward, done)")
    observation, reward, done = result
    if observation is not None and not isinstance(observation, str):
        raise EnvError(f"{where} returned observation {observation!r}: expected a str or None")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvError(f"{where} returned reward {reward!r}: expected a finite number")
    if not isinstance(done, bool):
        raise EnvError(f"{where} returned done {done!r}: expected True or False")
    return EnvStep(observation, float(reward), done)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _failure(cls: type, method: str, samples: list, e: BaseException) -> str:
    trace = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"environment {_name(cls)}.{method} raised {type(e).__name__}: {e} (samples {samples})\n{trace}"
