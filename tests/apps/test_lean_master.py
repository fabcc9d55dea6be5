"""The master, the launcher and the command line import no torch, transformers or CUDA library.

Each check runs in a fresh interpreter (this test process has torch loaded) with an import hook
that refuses those packages: a module that imports one fails the check naming the import chain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import realrl

HEAVY = ("torch", "transformers", "safetensors", "peft", "triton", "flash_attn", "pynvml", "nvidia")

REFUSE_HEAVY = textwrap.dedent(
    f"""
    import importlib.abc, sys, traceback

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in {HEAVY!r}:
                chain = [f"{{f.filename}}:{{f.lineno}}" for f in traceback.extract_stack()
                         if "importlib" not in f.filename and "<frozen" not in f.filename]
                raise ImportError(f"{{name}} imported by the master's side:\\n  " + "\\n  ".join(chain[-8:]))

    sys.meta_path.insert(0, Refuse())
    """
)


def run_lean(code: str, tmp_path) -> subprocess.CompletedProcess:
    script = tmp_path / "lean.py"
    script.write_text(REFUSE_HEAVY + textwrap.dedent(code))
    root = os.path.dirname(os.path.dirname(os.path.abspath(realrl.__file__)))  # the realrl under test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )


def check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_the_refusing_hook_catches_a_heavy_import(tmp_path):
    """The check itself can fail: importing a worker module is refused."""
    proc = run_lean("import realrl.system.model_worker\n", tmp_path)
    assert proc.returncode != 0 and "torch imported by the master's side" in proc.stderr


def test_master_launcher_and_command_line_modules_import_no_torch(tmp_path):
    check(
        run_lean(
            """
            import realrl.apps.main, realrl.apps.quickstart, realrl.apps.run, realrl.apps.configs
            import realrl.apps.summarize, realrl.apps.plan, realrl.apps.sweep
            import realrl.system.master_worker, realrl.system.launcher, realrl.system.standby
            import realrl.experiments
            """,
            tmp_path,
        )
    )


def test_building_and_validating_every_experiment_imports_no_torch(tmp_path):
    """Every experiment's config built and checked as the command line does, it and its runtime
    config written as JSON and read back: all of it without torch."""
    out = check(
        run_lean(
            f"""
            import json
            from realrl.apps.configs import build_config, register_everything
            from realrl.apps.main import load_config, save_config
            from realrl.api.core.layout_fit import check_layouts
            from realrl.api.quickstart.entrypoint import quickstart_experiments
            from realrl.base import config_json
            register_everything([])
            built = []
            for name in quickstart_experiments():
                extra = ["model.path=/nonexistent"] if name == "gen" else []
                cfg = build_config(name, ["fileroot={tmp_path}"] + extra)
                exp = cfg.initial_setup()
                path = "{tmp_path}/" + name + ".json"
                save_config(exp, path)
                assert load_config(path) == exp
                # the command line's config too: the evaluation process is handed it as JSON
                assert config_json.loads(config_json.dumps(cfg)) == cfg, name
                built.append(name)
            print(json.dumps(built))
            """,
            tmp_path,
        )
    )
    built = json.loads(out.strip().splitlines()[-1])
    assert {"ppo", "grpo", "sft", "rw", "dpo"} <= set(built)


def test_building_the_embedded_tasks_imports_no_torch(tmp_path):
    """The command line writes an embedded task's data and tokenizer before the first phase."""
    out = check(
        run_lean(
            f"""
            from realrl.experiments.tasks import get_task, task_names
            for name in task_names():
                print(name, sorted(get_task(name).files("{tmp_path}", 1)))
            """,
            tmp_path,
        )
    )
    assert "tokenizer" in out and len(out.strip().splitlines()) >= 2


@pytest.mark.parametrize(
    "argv", [["--help"], ["ppo", "--help"], ["ppo", "--cfg", "job"], ["grpo", "--cfg", "job"]]
)
def test_command_line_help_and_cfg_job_import_no_torch(tmp_path, argv):
    out = check(
        run_lean(
            f"""
            import runpy, sys
            sys.argv = ["quickstart"] + {argv!r} + (["fileroot={tmp_path}"] if "--cfg" in {argv!r} else [])
            try:
                runpy.run_module("realrl.apps.quickstart", run_name="__main__")
            except SystemExit as e:
                assert e.code in (0, None), e.code
            """,
            tmp_path,
        )
    )
    assert out.strip()  # it printed the help or the config
