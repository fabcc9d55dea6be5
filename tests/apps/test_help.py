"""``--help`` of the command lines, run as a user runs them: generated from the registries the
command line reads, every description whole sentences in plain text."""

import dataclasses
import json
import subprocess
import sys

import pytest

from realrl.api.quickstart.base import PlanSearchOptions
from realrl.apps.configs import build_config, register_everything
from realrl.apps.help_text import as_sentence, first_sentence, plain
from realrl.apps.search import _search_key


def run(module, *args, timeout=120):
    out = subprocess.run(
        [sys.executable, "-m", f"realrl.apps.{module}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def quickstart_help():
    return run("quickstart", "--help")


def entries(text: str, names: list[str]) -> dict[str, list[str]]:
    """name -> its description line and the lines under it, for each entry ``  <name>  ...``."""
    lines = text.splitlines()
    found = {}
    for i, line in enumerate(lines):
        first = line.split()[0] if line.startswith("  ") and line.strip() else ""
        if first in names and first not in found:
            found[first] = [line, lines[i + 1]]
    return found


# the registries as a fresh command line fills them (this process holds what other tests
# registered too, e.g. examples/my_ppo.py's experiment)
REGISTERED = """
import json
from realrl.api.quickstart.entrypoint import quickstart_experiments
from realrl.apps.configs import register_everything
from realrl.experiments.tasks import task_names
register_everything()
print(json.dumps([quickstart_experiments(), task_names()]))
"""


def test_quickstart_help_lists_every_registered_experiment_and_task(quickstart_help):
    fresh = subprocess.run([sys.executable, "-c", REGISTERED], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    experiments, tasks = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert "calc" in tasks and len(tasks) >= 5
    listed = entries(quickstart_help, experiments + tasks)
    assert sorted(listed) == sorted(experiments + tasks)
    for name in experiments:
        assert listed[name][1].strip().startswith("Option groups: "), listed[name]
    for name in tasks:
        assert listed[name][1].strip().startswith("Experiments: "), listed[name]
    assert "task=arith" not in quickstart_help  # not a hand-written list of some tasks


def test_quickstart_help_lists_only_the_groups_an_experiment_reads(quickstart_help):
    listed = entries(quickstart_help, ["grpo", "rloo", "ppo", "sft"])
    groups = {name: lines[1].split(":", 1)[1].strip(" .").split(", ") for name, lines in listed.items()}
    assert "critic" not in groups["grpo"] and "critic" not in groups["rloo"]
    assert {"actor", "ref", "rew", "ppo"} <= set(groups["grpo"])
    assert {"actor", "critic", "ref", "rew", "ppo"} <= set(groups["ppo"])
    assert "model" in groups["sft"] and "actor" not in groups["sft"]


def test_quickstart_help_is_whole_sentences_in_plain_text(quickstart_help):
    assert quickstart_help.startswith("usage: python -m realrl.apps.quickstart ")
    assert "``" not in quickstart_help
    body = quickstart_help.split("\n\n", 1)[1]  # after the usage lines
    for line in body.splitlines():
        if line.strip():
            assert line.rstrip().endswith((".", ":")), f"cut line: {line!r}"


def test_experiment_help_leaves_out_the_groups_it_never_reads():
    grpo = run("quickstart", "grpo", "--help")
    assert grpo.startswith("usage: python -m realrl.apps.quickstart grpo")
    top = [line.split(":")[0] for line in grpo.splitlines() if line and not line.startswith(" ")]
    assert "critic" not in top and "actor" in top and "rew" in top
    assert "Left out: critic" in grpo and "``" not in grpo
    ppo = run("quickstart", "ppo", "--help")
    assert "critic" in [line.split(":")[0] for line in ppo.splitlines()] and "Left out" not in ppo


def test_search_help_has_a_usage_line_and_every_option_by_its_full_name():
    text = run("search", "--help")
    assert text.startswith("usage: python -m realrl.apps.search <experiment>")
    assert "``" not in text
    options = [line.strip() for line in text.splitlines() if line.startswith("  search.")]
    names = [line.split("=", 1)[0] for line in options]
    assert names == [f"search.{f.name}" for f in dataclasses.fields(PlanSearchOptions)]
    assert "search.verify=3" in text and "search.n_nodes=1" in text  # their defaults
    for line in options:
        assert line.endswith("."), f"no whole sentence: {line!r}"
    for paragraph in text.split("\n\n")[1:]:
        assert paragraph.rstrip().endswith((".", ":")), paragraph


def test_search_verify_spelling_is_accepted():
    """``search.verify=0`` is the option; the search command also reads ``verify=0`` as it, while
    the quickstart command refuses the bare name (it is no experiment option)."""
    cfg = run("quickstart", "ppo", "search.verify=0", "--cfg", "job")
    assert "  verify: 0" in cfg.splitlines()
    assert _search_key("verify=0") == "search.verify=0"
    register_everything()
    assert build_config("ppo", [_search_key("verify=0"), _search_key("reprofile=true")]).search.verify == 0
    bare = subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", "ppo", "verify=0", "--cfg", "job"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bare.returncode == 2 and "verify" in bare.stderr


@pytest.mark.parametrize("module", ["plan", "graph", "summarize", "main"])
def test_other_commands_start_their_help_with_a_usage_line(module):
    text = run(module, "--help")
    assert text.startswith(f"usage: python -m realrl.apps.{module}"), text[:200]


def test_a_docstring_gives_its_first_whole_sentence():
    wrapped = "GRPO: PPO's graph without a critic; K answers per prompt, and a\nrule-based reward. More."
    assert (
        first_sentence(wrapped)
        == "GRPO: PPO's graph without a critic; K answers per prompt, and a rule-based reward."
    )
    assert (
        first_sentence("Runs (e.g. on ``ref_inf``. twice) here. Then.")
        == "Runs (e.g. on ref_inf. twice) here."
    )
    assert as_sentence("a phrase") == "A phrase." and plain("``a`` and `b`") == "a and b"
