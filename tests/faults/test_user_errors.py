"""A user's mistake, in the options or in the data, is one line naming the key (or the file and
line) and exit status 2: never a traceback, never a hang. Fuzzed with hypothesis through the
functions the command line runs (``prepare``: argv -> checked phases, the dataset loaders), and a
few real runs of the command line end to end."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from system_graphs import single_call_config

from realrl.api.core.config import DatasetAbstraction
from realrl.api.core.data_api import load_hf_tokenizer, make_dataset
from realrl.api.quickstart.entrypoint import get_quickstart_exp
from realrl.apps.configs import register_everything
from realrl.apps.errors import UserError, data_error_message
from realrl.apps.main import save_config
from realrl.apps.quickstart import prepare
from realrl.impl.dataset.errors import DataError
from realrl.impl.dataset.toy.vocab import ToyVocab
from realrl.system.request_reply_stream import WorkerError


def fuzz(n: int) -> settings:
    """``n`` examples, the same on every run (no flaky failures), no per-example deadline."""
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


PLUGIN_FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin_files")
SLOW_S = 30  # no argv or data file takes longer (the toy task, made once, takes ~4 s; a hang would)


# -- fixtures: a folder the runs read from -------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Data files of every kind the experiments read and a model folder (only its config.json
    is read before workers start)."""
    root = tmp_path_factory.mktemp("user_errors")
    (root / "m").mkdir()
    (root / "m" / "config.json").write_text("{}")
    rows = {
        "sft.jsonl": {"prompt": "a b", "answer": "c"},
        "pairs.jsonl": {"prompt": "a", "chosen": "b", "rejected": "c"},
        "prompts.jsonl": {"prompt": "a b"},
    }
    for name, row in rows.items():
        (root / name).write_text(json.dumps(row) + "\n")
    return root


def base_argv(name: str, root, fileroot: str = "out") -> list[str]:
    """A runnable command line of ``name`` on the user's own files (not the toy task)."""
    m = root / "m"
    return {
        "sft": ["sft", f"model.path={m}", f"dataset.train_path={root}/sft.jsonl"],
        "rw": ["rw", f"model.path={m}", f"dataset.train_path={root}/pairs.jsonl"],
        "dpo": ["dpo", f"actor.path={m}", f"dataset.train_path={root}/pairs.jsonl"],
        "ppo": ["ppo", f"actor.path={m}", f"rew.path={m}", f"dataset.path={root}/prompts.jsonl"],
        "grpo": ["grpo", f"actor.path={m}", f"dataset.path={root}/prompts.jsonl", "reward_fn=toy_sentiment"],
        "gen": ["gen", f"model.path={m}", f"dataset.path={root}/prompts.jsonl"],
    }[name] + [f"fileroot={root}/{fileroot}"]


def leaf_keys(cls, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(value):
            out += leaf_keys(type(value), f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def assert_named(message: str, overrides: list[str]) -> None:
    """One line that names one of the overrides: its key, the key's last part, or its value."""
    assert message and "\n" not in message and "Traceback" not in message, message
    names = set()
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+")
        names |= {key, repr(key)[1:-1], key.rsplit(".", 1)[-1], value.strip("\"'")} - {""}
    assert any(n in message for n in names), (overrides, message)


# -- the options, fuzzed -------------------------------------------------------------------------

EXPERIMENTS = ("sft", "rw", "dpo", "ppo", "grpo", "gen")
text = st.text(alphabet=st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=12)
layout = st.builds("d{}m{}p{}".format, st.integers(-1, 9), st.integers(-1, 4), st.integers(-1, 3))
allocation = st.one_of(
    layout,
    st.builds(
        "{}:{}{}".format,
        st.sampled_from(["actor", "critic", "ref", "reward", "default", "*", "actor_gen", "x", ""]),
        layout | text,
        st.sampled_from(["", "@1", "@-1", "@x", "@"]),
    ),
    st.lists(st.sampled_from(["actor:d1", "*:d2", "critic:d1m2p1@1", "d1", ""]), max_size=4).map(",".join),
    text,
)
value = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        ["true", "null", "nan", "-1", "0", "1e-4", "[1,2]", "[1", "{a: 1}", "[]", "''", "${seed}", "${nope}"]
        + ["k3", "auto", "cuda", "sdpa", "linear", "manual", "ray", "resume", "grpo", "zeros", "a,b", "*x"]
    ),
    text,
    allocation.map('"{}"'.format),
    allocation,
)
unknown_key = st.one_of(
    text.filter(lambda k: k and "=" not in k),
    st.builds(
        "{}.{}".format, st.sampled_from(["actor", "ppo", "dataset", "exp_ctrl", "model", "ppo.gen"]), text
    ),
)


@pytest.mark.slow  # 150 generated command lines; the named cases above run in the default suite
@fuzz(150)
@given(st.sampled_from(EXPERIMENTS), st.data())
def test_fuzzed_options_are_taken_or_refused_by_name(workdir, name, data):
    register_everything()
    keys = [k for k in leaf_keys(get_quickstart_exp(name)) if k != "fileroot"]  # writes nowhere else
    overrides = []
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.one_of(st.sampled_from(keys), unknown_key, st.just("allocation_mode")))
        overrides.append(f"{key}={data.draw(allocation if key == 'allocation_mode' else value)}")
    tik = time.monotonic()
    try:
        command = prepare(base_argv(name, workdir, "fuzz") + overrides)
    except UserError as e:
        assert_named(str(e), overrides)
    else:
        assert command.phases and command.phases[-1].experiment.mfcs
    assert time.monotonic() - tik < SLOW_S


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sft"], "model.path is required"),
        (["rw"], "model.path is required"),
        (["dpo"], "actor.path is required"),
        (["ppo"], "actor.path is required"),
        (["ppo", "actor.path={m}"], "rew.path is required"),
        (["grpo", "reward_fn=toy_sentiment"], "actor.path is required"),
        (["grpo"], "grpo needs a reward: reward_fn="),
        (["grpo", "actor.path={m}", "env={root}/envs.py:Calc"], "env='{root}/envs.py:Calc': no such file"),
        (
            ["grpo", "actor.path={m}", "agent={root}/agent.py:run"],
            "agent='{root}/agent.py:run': no such file",
        ),
        (
            ["grpo", "actor.path={m}", "reward_fn=toy_sentiment", "ppo.max_turns=3"],
            "ppo.max_turns=3 takes turns",
        ),
        (
            ["grpo", "actor.path={m}", "env=calc", f"agent={PLUGIN_FILES}/plugins_ok.py:run"],
            "env and agent both produce the trajectories",
        ),
        (  # the missing file first, then what the experiment says of the options
            ["grpo", "actor.path={m}", "env=calc", "agent=a.py:run"],
            "agent='a.py:run': no such file 'a.py'",
        ),
        (["gen"], "model.path is required"),
        (["sft", "model.path={root}/nope"], "model.path='{root}/nope': no such folder"),
        (["sft", "model.path={root}/sft.jsonl"], "model.path='{root}/sft.jsonl': is a file"),
        (["sft", "model.path={root}"], "model.path='{root}': has no config.json"),
        (["sft", "tokenizer_path={root}/nope"], "tokenizer_path='{root}/nope': no such folder"),
        (
            ["sft", "dataset.train_path={root}/nope.jsonl"],
            "dataset.train_path='{root}/nope.jsonl': no such file",
        ),
        (
            ["sft", "dataset.valid_path={root}/nope.jsonl"],
            "dataset.valid_path='{root}/nope.jsonl': no such file",
        ),
        (["ppo", "dataset.path={root}/m/config.txt"], "dataset.path='{root}/m/config.txt': no such file"),
        (["ppo", "dataset.path={root}/m/config.json"], "actor.path is required"),
        (
            ["sft", "import_modules=[{root}/plugins.py]"],
            "import_modules[0]='{root}/plugins.py': no such file",
        ),
    ],
)
def test_paths_and_required_models_are_named_before_any_worker(workdir, argv, message):
    name, user = argv[0], [a.format(root=workdir, m=workdir / "m") for a in argv[1:]]
    data_key = "dataset.train_path" if name in ("sft", "rw", "dpo") else "dataset.path"
    data = f"{workdir}/{'pairs' if name in ('rw', 'dpo') else 'sft' if name == 'sft' else 'prompts'}.jsonl"
    if not any(u.startswith(data_key + "=") for u in user):
        user.append(f"{data_key}={data}")
    with pytest.raises(UserError) as info:
        prepare([name, f"fileroot={workdir}/out", *user])
    assert message.format(root=workdir) in str(info.value)
    assert not (workdir / "out").exists()  # nothing ran, nothing was written


def test_a_prerequisite_phase_is_checked_before_any_phase_runs(tmp_path):
    with pytest.raises(UserError, match=r"the sft phase this run builds on: model.path='/nope': no such"):
        prepare(["ppo", f"fileroot={tmp_path}", "prerequisite_overrides=[model.path=/nope]"])
    with pytest.raises(UserError, match=r"^rew.path='/nope': no such folder"):  # before the toy task is made
        prepare(["ppo", f"fileroot={tmp_path}", "rew.path=/nope"])
    assert not (tmp_path / "toy_task").exists()


def test_a_data_error_is_found_in_a_workers_traceback():
    remote = (
        "Traceback (most recent call last):\n  File ...\njson.decoder.JSONDecodeError: Expecting value\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n  File ...\n"
        "realrl.impl.dataset.errors.DataError: d.jsonl: line 3: malformed JSON (Expecting value at col 1)\n"
    )
    assert data_error_message(WorkerError("model_worker/0", "setup", remote)) == (
        "d.jsonl: line 3: malformed JSON (Expecting value at col 1)"
    )
    wrapped = remote + "\nDuring handling of the above exception, another exception occurred:\n\n"
    wrapped += "Traceback (most recent call last):\n  File ...\nRuntimeError: a bug while reporting it\n"
    assert data_error_message(WorkerError("model_worker/0", "setup", wrapped)) is None
    assert data_error_message(RuntimeError("boom")) is None


# -- the data, fuzzed ----------------------------------------------------------------------------

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
DATASETS = {  # the dataset each experiment reads, with a length limit as the experiments set one
    "prompt_answer": {"max_length": 64},  # sft
    "rw_paired": {"max_length": 64},  # rw, dpo
    "prompt": {"max_prompt_len": 64},  # ppo, grpo, gen
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = load_hf_tokenizer(ToyVocab().save_tokenizer(str(tmp_path_factory.mktemp("tok"))))
    tok.chat_template = CHAT_TEMPLATE  # conversational rows too
    return tok


def load(kind: str, path: str, tokenizer):
    return make_dataset(
        DatasetAbstraction(kind, {"dataset_path": path, **DATASETS[kind]}), 1, 0, 1, tokenizer
    )


scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=20)
)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]) | scalar, "content": scalar})
anything = st.recursive(
    scalar | st.lists(message, max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
words = st.lists(st.sampled_from(["the", "cat", "sat", ".", "<eos>", "é", "\u2028"]), max_size=8).map(
    " ".join
)
token_ids = st.lists(st.integers(-5, 2**70), max_size=5)
FIELDS = {
    "prompt": words,
    "answer": words,
    "chosen": words,
    "rejected": words,
    "margin": st.floats(allow_nan=True, allow_infinity=True),
    "chosen_ids": token_ids,
    "rejected_ids": token_ids,
}


def row_of(*required: str):
    optional = {k: v | anything for k, v in FIELDS.items() if k not in required}
    return st.fixed_dictionaries({k: FIELDS[k] | anything for k in required}, optional=optional)


rows = st.one_of(
    row_of("prompt", "answer"),
    row_of("prompt", "chosen", "rejected"),
    row_of("prompt"),
    row_of("chosen_ids", "rejected_ids"),
)
line = st.one_of(
    rows.map(json.dumps),
    rows.map(lambda r: json.dumps(r, ensure_ascii=False)),
    st.sampled_from(["", "   ", "null", "[1, 2]", '{"prompt": ', "\ufeff{}", "1" * 5000, "[" * 100000]),
    st.text(max_size=30),
)


@fuzz(200)
@given(st.sampled_from(sorted(DATASETS)), st.lists(line, max_size=5), st.booleans(), st.binary(max_size=4))
def test_fuzzed_rows_are_taken_or_refused_naming_file_and_line(
    tmp_path_factory, tokenizer, kind, lines, bom, junk
):
    path = tmp_path_factory.mktemp("rows") / "data.jsonl"
    raw = "\n".join(lines).encode("utf-8", "surrogatepass")
    if junk and lines:  # bytes that need not be UTF-8, in the middle of the last line
        raw = raw[: len(raw) // 2] + junk + raw[len(raw) // 2 :]
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + raw)
    tik = time.monotonic()
    try:
        dataset = load(kind, str(path), tokenizer)
    except DataError as e:
        assert str(e).startswith(f"{path}: ") and "\n" not in str(e), str(e)
        assert "line " in str(e) or "empty" in str(e), str(e)
    else:
        assert len(dataset) + dataset.n_filtered >= 1
    assert time.monotonic() - tik < SLOW_S


@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_data_files_a_user_may_have(tmp_path, tokenizer, kind):
    good = {"prompt": "the cat", "answer": "sat .", "chosen": "sat .", "rejected": "the ."}
    path = tmp_path / "d.jsonl"

    def refused(content: bytes) -> str:
        path.write_bytes(content)
        with pytest.raises(DataError) as info:
            load(kind, str(path), tokenizer)
        return str(info.value)

    row = json.dumps(good).encode()
    path.write_bytes(b"\xef\xbb\xbf" + row + b"\r\n\r\n" + row + b"\n")  # a BOM, Windows line ends
    assert len(load(kind, str(path), tokenizer)) == 2
    big = json.dumps({**good, "notes": "x" * 10 * 2**20}).encode()  # a 10 MB row: its column is unused
    path.write_bytes(big + b"\n" + row + b"\n")
    assert len(load(kind, str(path), tokenizer)) == 2
    assert refused(b"") == f"{path}: empty (no rows)"
    assert refused(b"\n  \n") == f"{path}: empty (no rows)"
    assert refused(row + b"\n" + row[:9] + b"\xff\xfe" + row[9:]).startswith(
        f"{path}: line 2: not UTF-8 text"
    )
    assert refused(row + b"\n\n" + big[: 10 * 2**20]).startswith(f"{path}: line 3: malformed JSON")
    assert refused(row + b'\n{"other": 1}\n').startswith(f"{path}: line 2: missing field")
    json_path = tmp_path / "d.json"
    json_path.write_bytes(b"\xef\xbb\xbf[" + row + b"]")
    assert len(load(kind, str(json_path), tokenizer)) == 1


def test_a_chat_template_that_refuses_the_messages_is_named(tmp_path, tokenizer):
    strict = load_hf_tokenizer(tokenizer.name_or_path)
    strict.chat_template = "{{ raise_exception('roles must alternate user/assistant') }}"
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(path))}: line 1: field 'prompt': the chat template"
    ):
        load("prompt", str(path), strict)


# -- end to end ----------------------------------------------------------------------------------


def cli(
    *args: str, module: str = "realrl.apps.quickstart", timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout
    )


def assert_one_error_line(out: subprocess.CompletedProcess, message: str) -> None:
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], out.stderr[-3000:]
    for noise in ("Traceback", "Error executing job", "HYDRA_FULL_ERROR"):
        assert noise not in out.stdout + out.stderr


def test_the_cli_names_a_missing_model_and_a_missing_file(workdir):
    out = cli("sft", f"dataset.train_path={workdir}/sft.jsonl", f"fileroot={workdir}/cli")
    assert_one_error_line(out, "error: model.path is required")
    out = cli("ppo", f"dataset.path={workdir}/nope.jsonl", f"fileroot={workdir}/cli")
    assert_one_error_line(out, f"error: dataset.path='{workdir}/nope.jsonl': no such file or folder")
    assert not (workdir / "cli").exists()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A real (random) llama checkpoint folder the toy tokenizer fits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = str(tmp_path_factory.mktemp("tiny_llama"))
    vocab = ToyVocab()
    vocab.save_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=len(vocab.tokens),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=vocab.tokens.index("<bos>"),
        eos_token_id=vocab.tokens.index("<eos>"),
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_bad_row_a_worker_finds_is_one_named_line(tmp_path, tiny_model):
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "the cat", "answer": "sat ."}\n\n{"prompt": "the"}\n')
    out = cli(
        "sft",
        f"model.path={tiny_model}",
        f"dataset.train_path={data}",
        f"fileroot={tmp_path}",
        "standby_workers=0",
    )
    assert_one_error_line(out, f"error: {data}: line 3: missing field 'answer' (fields present: ['prompt'])")
    log = (tmp_path / "sft" / "default" / "logs" / "model_worker-0.log").read_text()
    assert "Traceback" in log and "DataError" in log  # the whole story stays in the worker's log


def test_a_worker_crash_is_no_user_error(tmp_path):
    cfg = single_call_config(tmp_path, "crash", "sys_test_raise")
    path = tmp_path / "config.json"
    save_config(cfg, str(path))
    out = cli(str(path), module="realrl.apps.main")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "realrl: experiment" in out.stderr and "model_worker/" in out.stderr
    assert "ValueError: boom from the mock interface" in out.stderr  # the worker's traceback, kept
    assert os.path.isdir(cfg.log_dir)


BROKEN_ENV = """
class Broken:
    def __init__(self, prompt, **metadata):
        pass

    def step(self, completion):
        return self.look_up_the_tool(completion)

    def look_up_the_tool(self, completion):
        raise KeyError("the tool has no entry for " + repr(completion[:0]))
"""


def test_an_environment_that_raises_stops_the_run_with_its_traceback_and_samples(tmp_path, tiny_model):
    """A user's environment failing in a worker: exit 1 (it is not a configuration error), the
    message names the environment, the trajectories' sample ids and the user's own frames."""
    env = tmp_path / "broken_env.py"
    env.write_text(BROKEN_ENV)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("the cat", "a dog", "the")))
    out = cli(
        "grpo",
        f"actor.path={tiny_model}",
        f"dataset.path={prompts}",
        f"env={env}:Broken",
        "ppo.max_turns=2",
        "ppo.gen.max_new_tokens=2",
        "dataset.train_bs_n_seqs=2",
        f"fileroot={tmp_path}",
        "standby_workers=0",
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert "EnvError" in out.stderr and "broken_env.Broken.step raised KeyError" in out.stderr
    assert "look_up_the_tool" in out.stderr  # the user's frames, not only realrl's
    assert re.search(r"samples \['[^']+/\d'\]", out.stderr), out.stderr[-3000:]  # the trajectory's sample


# -- the user's plugins and layouts, refused before anything runs or is written --------------------

EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"
)
SYNTAX_ERROR_ENV = """\"\"\"An environment with a missing colon on line 4.\"\"\"

class Broken:
    def step(self, completion)
        return None, 0.0, True
"""


def assert_refused_up_front(out: subprocess.CompletedProcess, message: str, fileroot) -> None:
    """One ``error:`` line with ``message``, exit 2, no worker started and nothing written."""
    assert_one_error_line(out, message)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert "model_worker" not in out.stderr
    assert not os.path.exists(fileroot), sorted(os.listdir(fileroot))


@pytest.mark.parametrize(
    "override, message",
    [
        ("env={tmp}/broken_env.py:Broken", "{tmp}/broken_env.py, line 4: SyntaxError: expected ':'"),
        ("env={examples}/envs/retry.py:Retyr", "retry.py has no 'Retyr'; did you mean 'Retry'?"),
        ("reward_fn={plugins}/plugins_ok.py:scor", "plugins_ok.py has no 'scor'; did you mean 'score'?"),
        (
            "reward_fn={plugins}/fails_on_import.py:score",
            "{plugins}/fails_on_import.py, line 4: NameError: name 'undefined_constant' is not defined",
        ),
        ("agent={plugins}/plugins_ok.py:rn", "did you mean 'run'?"),
        (
            "import_modules=[{tmp}/broken_env.py]",
            "cannot import {tmp}/broken_env.py: {tmp}/broken_env.py, line 4: SyntaxError",
        ),
        ("reward_fn=json:dumpz", "reward_fn='json:dumpz': json has no 'dumpz'; did you mean 'dump'?"),
        ("reward_fn=realrl.impl.no_such_module:f", "no module 'realrl.impl.no_such_module'"),
    ],
)
def test_a_plugin_that_does_not_load_is_one_line_before_anything_runs(tmp_path, override, message):
    """A plugin file with a syntax error, a misspelled class or function, a module that raises:
    imported by the command line first, named with its file and line (or the closest name)."""
    (tmp_path / "broken_env.py").write_text(SYNTAX_ERROR_ENV)
    fileroot = tmp_path / "out"
    values = {"tmp": tmp_path, "plugins": PLUGIN_FILES, "examples": EXAMPLES}
    out = cli(
        "grpo",
        "task=arith",
        override.format(**values),
        f"fileroot={fileroot}",
        "standby_workers=0",
        timeout=60,
    )
    assert_refused_up_front(out, message.format(**values), fileroot)


def test_a_missing_file_is_named_before_what_the_experiment_requires(tmp_path):
    """``grpo`` on a data file that does not exist: the file, not "grpo needs a reward"."""
    out = cli("grpo", f"dataset.path={tmp_path}/nope.jsonl", f"fileroot={tmp_path}/out", timeout=60)
    assert_refused_up_front(out, f"dataset.path='{tmp_path}/nope.jsonl': no such file", tmp_path / "out")


@pytest.mark.parametrize(
    "override, message",
    [
        ("allocation_mode=d1m3p1", "tensor-parallel size m3 does not divide the model's 4 query heads"),
        ("device=cuda", "device=cuda: no CUDA device is visible on this machine"),
    ],
)
def test_a_refused_layout_or_device_writes_nothing(tmp_path, override, message):
    """Refused for the first phase the run builds on, before the embedded task's files, a graph
    picture or the summary process: the fileroot is never made."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, whatever the machine has
    out = subprocess.run(
        [sys.executable, "-m", "realrl.apps.quickstart", "ppo", override, f"fileroot={tmp_path}/out"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert_refused_up_front(out, message, tmp_path / "out")
