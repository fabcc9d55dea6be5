"""Plugins reach the command line: a user's experiment file named in ``import_modules`` (ReaL's
"my-ppo" example as its documentation writes the command) and an installed package's
``realrl.plugins`` entry point. Both in fresh processes, as a user runs them."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_my_ppo_is_found_through_import_modules():
    out = _cli(
        ["my-ppo", "import_modules=[examples/my_ppo.py]", "ppo.top_p=0.9", "ppo.top_k=1000", "--cfg", "job"]
    )
    assert out.returncode == 0, out.stderr
    assert "scoring_max_words: 12" in out.stdout  # MyPPOConfig's own option
    assert "top_p: 0.9" in out.stdout and "top_k: 1000" in out.stdout
    missing = _cli(["my-ppo", "--cfg", "job"])
    assert missing.returncode == 2 and "unknown experiment 'my-ppo'" in missing.stderr
    broken = _cli(["my-ppo", "import_modules=[examples/no_such_file.py]"])
    assert broken.returncode == 2 and "no_such_file.py" in broken.stderr


def test_an_installed_package_registers_an_experiment_and_a_reward_function(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "realrl_demo_plugin").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "realrl-demo-plugin"
            version = "0.1"
            [project.entry-points."realrl.plugins"]
            demo = "realrl_demo_plugin:register"
            """
        )
    )
    (pkg / "realrl_demo_plugin" / "__init__.py").write_text(
        textwrap.dedent(
            """\
            import dataclasses


            def length_reward(prompts, completions, **kwargs):
                return [float(len(c.split())) for c in completions]


            def register():
                from realrl.api.core.model_api import register_reward_fn
                from realrl.api.quickstart.entrypoint import register_quickstart_exp
                from realrl.experiments.grpo import GRPOConfig

                @dataclasses.dataclass
                class DemoConfig(GRPOConfig):
                    demo_option: int = 7

                register_reward_fn("demo_length", length_reward)
                register_quickstart_exp("demo-grpo", DemoConfig)
            """
        )
    )
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(pkg),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), REPO])}
    out = _cli(["demo-grpo", "reward_fn=demo_length", "--cfg", "job"], env)
    assert out.returncode == 0, out.stderr
    assert "demo_option: 7" in out.stdout and "reward_fn: demo_length" in out.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from realrl.system.model_worker import import_plugins; import_plugins([]);"
            "from realrl.api.core.model_api import get_reward_fn; print(get_reward_fn('demo_length')([''], ['a b c']))",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[3.0]"  # what a worker loads before building anything
