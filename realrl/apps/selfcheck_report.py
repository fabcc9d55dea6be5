"""The pure parts of ``python -m realrl.apps.selfcheck``: the figures a check printed or wrote,
targets judged against them, a check's verdict, and the report (``selfcheck.json``, the table on
stdout, ``selfcheck.md``). No processes and no files here, so that tests feed them recorded output.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Figures = dict[str, Any]  # figure name -> a number (or a string: an attention backend, an error)
Parser = Callable[[str, Mapping[str, Any] | None], Figures]  # (output, summary.json or None) -> figures

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"

# what the report says about the machine, in this order; a value it could not find is null
ENV_FIELDS = (
    "date",
    "hostname",
    "device",
    "device_name",
    "driver_version",
    "cuda_version",
    "torch_version",
    "flash_attn_version",
    "triton_version",
    "python_version",
    "cpu_count",
    "engine_dtype",
    "git_commit",
    "git_dirty",
)
TAIL_LINES = 40
TAIL_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Target:
    """A figure a passing check must reach: ``figure op value`` (``op``: ">=", "<=", "==")."""

    figure: str
    op: str
    value: float
    why: str = ""  # where the number comes from


_OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


@dataclasses.dataclass
class CheckResult:
    """One check's outcome, as the report stores it."""

    name: str
    command: str
    status: str  # pass | fail | skipped
    seconds: float = 0.0
    figures: Figures = dataclasses.field(default_factory=dict)
    targets: list[dict] = dataclasses.field(default_factory=list)
    reason: str = ""  # why it failed or was skipped
    tail: str = ""  # the last lines of its output (the report keeps them for failures only)
    log: str = ""  # its whole output, on disk
    shown: list[str] = dataclasses.field(default_factory=list)  # figures the table shows


# --- output text -------------------------------------------------------------------------------


def clean_lines(text: str) -> list[str]:
    """Lines as a terminal would end up showing them: a progress bar's carriage-return redraws
    keep only their last state."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def tail(text: str, n_lines: int = TAIL_LINES, max_chars: int = TAIL_CHARS) -> str:
    lines = clean_lines(text)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines[-n_lines:])[-max_chars:]


def _number(text: str) -> float | int:
    value = float(text.replace(",", ""))
    return int(value) if value.is_integer() and "." not in text else value


# --- figures -----------------------------------------------------------------------------------

_PYTEST_SUMMARY = re.compile(r"\b(?:no tests ran|\d+ \w+).* in [\d.]+s\b")
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)\b")


def parse_pytest(text: str, summary: Mapping[str, Any] | None = None) -> Figures:
    """Counts from pytest's last summary line (``3 passed, 1 skipped, 500 deselected in 9.1s``)."""
    lines = [line for line in clean_lines(text) if _PYTEST_SUMMARY.search(line)]
    if not lines:
        return {}
    figures: Figures = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for count, what in _PYTEST_COUNT.findall(lines[-1]):
        key = {"error": "errors", "warning": "warnings"}.get(what, what)
        figures[key] = int(count)
    return figures


# bench_generate.py's rows: name, wall tok/s, CPU-time tok/s, new tokens, roofline tok/s, % of roofline
_GEN_ROW = re.compile(
    r"^(?P<name>[A-Za-z]\S*(?: \S+)*?)\s+(?P<wall>\d+)\s+(?P<cpu>\d+)\s+(?P<new>\d+)\s+(?P<roof>\d+)\s+"
    r"(?P<pct>[\d.]+)%$"
)
_GEN_SKIPPED = re.compile(r"^(?P<name>[A-Za-z]\S*(?: \S+)*?)\s+did not run: (?P<why>.*)$")
# --kernel-shares: a mode's speed over the same mode's with one kernel off (--torch-kernels: all)
_GEN_SHARE = re.compile(r"^ratio (?P<own>realrl \S+) / (?P=own) torch (?P<op>\S+)\s+(?P<x>[\d.]+)x wall$")
_BANDWIDTH = re.compile(r"measured bandwidth ([\d.]+) GB/s")
_ATTENTION = re.compile(r"attention (\w+)")


def _key(name: str) -> str:
    return re.sub(r"\W+", "_", name.strip()).strip("_")


def parse_bench_generate(text: str, headline: str) -> Figures:
    """Per decoding side of ``benchmarks/bench_generate.py``: ``<side>_tok_s`` (wall) and
    ``<side>_roofline_pct``; ``decode_tok_s`` / ``roofline_pct`` are the ``headline`` side's
    (e.g. "realrl cuda_graph"), ``speedup_vs_hf`` its ratio to transformers ``generate``. A side that
    did not run leaves ``<side>_error`` and no numbers, so a target on it fails by name. With
    ``--kernel-shares``, ``<side>_share_<op>``: the side's tokens/s over its own with kernel ``op``
    off (1.25: the kernel makes decoding 1.25x faster), ``share_<op>`` the headline side's."""
    figures: Figures = {}
    for line in clean_lines(text):
        if m := _GEN_SHARE.match(line):
            figures[f"{_key(m['own'])}_share_{m['op']}"] = float(m["x"])
        elif m := _GEN_ROW.match(line):
            key = _key(m["name"])
            figures[f"{key}_tok_s"] = int(m["wall"])
            figures[f"{key}_roofline_pct"] = float(m["pct"])
            figures[f"{key}_new_tokens"] = int(m["new"])
        elif m := _GEN_SKIPPED.match(line):
            figures[f"{_key(m['name'])}_error"] = m["why"]
        else:
            if m := _BANDWIDTH.search(line):
                figures["bandwidth_gb_s"] = _number(m[1])
            if m := _ATTENTION.search(line):
                figures["attn_impl"] = m[1]
    head = _key(headline)
    if f"{head}_tok_s" in figures:
        figures["decode_tok_s"] = figures[f"{head}_tok_s"]
        figures["roofline_pct"] = figures[f"{head}_roofline_pct"]
        if figures.get("transformers_generate_tok_s"):
            figures["speedup_vs_hf"] = round(
                figures["decode_tok_s"] / figures["transformers_generate_tok_s"], 3
            )
    own_share = f"{head}_share_"
    figures.update({f"share_{k[len(own_share) :]}": v for k, v in figures.items() if k.startswith(own_share)})
    return figures


_FWD_ROW = re.compile(r"^(?P<side>ReaLModel|transformers) (?:packed|padded) fwd\+bwd\s+(\d+)\s+(\d+)$")
_FWD_RATIO = re.compile(r"^ratio \(ReaLModel / HF\)\s+([\d.]+)x\s+([\d.]+)x$")
_FWD_PEAK = re.compile(r"peak GPU memory of a step: ReaLModel ([\d.]+) GiB, HF ([\d.]+) GiB")
_FWD_MODEL = re.compile(r"^model: .*?([\d.]+)M params; (\d+) sequences, (\d+) tokens.*, (\w+)$")


def parse_bench_forward(text: str, summary: Mapping[str, Any] | None = None) -> Figures:
    """``benchmarks/bench_forward.py``: forward + backward tokens/s of ReaLModel on the packed batch
    (``realrl_tok_s``) and of transformers on the padded one (``hf_tok_s``), their ratio, the peak
    GPU memory of each, the model size and realrl's attention backend."""
    figures: Figures = {}
    for line in clean_lines(text):
        if m := _FWD_ROW.match(line):
            side = "realrl" if m["side"] == "ReaLModel" else "hf"
            figures[f"{side}_tok_s"], figures[f"{side}_cpu_tok_s"] = int(m[2]), int(m[3])
        elif m := _FWD_RATIO.match(line):
            figures["speedup_vs_hf"], figures["speedup_vs_hf_cpu_time"] = float(m[1]), float(m[2])
        elif m := _FWD_PEAK.search(line):
            figures["realrl_peak_gib"], figures["hf_peak_gib"] = float(m[1]), float(m[2])
        elif m := _FWD_MODEL.match(line):
            figures["params_m"], figures["n_seqs"], figures["tokens"] = float(m[1]), int(m[2]), int(m[3])
            figures["attn_impl"] = m[4]
    return figures


def summary_figures(
    summary: Mapping[str, Any] | None, keys: Sequence[str], prefixes: Sequence[str] = ()
) -> Figures:
    """The numbers of a run's ``summary.json`` named in ``keys`` or starting with one of
    ``prefixes`` (``realloc/``); a key the run did not write is left out."""
    if not summary:
        return {}
    return {
        k: v
        for k, v in summary.items()
        if (k in keys or k.startswith(tuple(prefixes)))
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    }


def rollout_corr_figures(summary: Mapping[str, Any] | None) -> Figures:
    """The trainer-against-decoder statistics of a run's last step (``<call>/rollout_corr/<stat>``
    in ``summary.json``, written with ``ppo.recompute_logprobs``) as ``rollout_corr/<stat>``."""
    if not summary:
        return {}
    return {
        k.split("/", 1)[1]: v
        for k, v in summary.items()
        if k.split("/", 1)[-1].startswith("rollout_corr/")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
    }


# --- verdicts ----------------------------------------------------------------------------------


def judge_targets(figures: Mapping[str, Any], targets: Sequence[Target]) -> list[dict]:
    """Each target with the figure it got (None when missing) and whether it is met."""
    out = []
    for t in targets:
        got = figures.get(t.figure)
        number = isinstance(got, (int, float)) and not isinstance(got, bool)
        met = bool(number and _OPS[t.op](got, t.value))
        out.append({"figure": t.figure, "op": t.op, "value": t.value, "got": got, "met": met, "why": t.why})
    return out


def describe_target(t: Mapping[str, Any]) -> str:
    """``decode_tok_s 2,540 < 12,690 (5 x 2,538 tok/s)``, or that the figure is missing."""
    if t["got"] is None:
        return f"{t['figure']} missing"
    relation = t["op"] if t["met"] else {">=": "<", "<=": ">", "==": "!="}[t["op"]]
    why = f" ({t['why']})" if t.get("why") else ""
    return f"{t['figure']} {fmt(t['got'])} {relation} {fmt(t['value'])}{why}"


def verdict(
    returncode: int | None, timed_out: bool, timeout_s: float, targets: Sequence[Mapping], problem: str = ""
) -> tuple[str, str]:
    """(status, reason) of a check that ran: it must exit 0 in time, have nothing else wrong
    (``problem``: e.g. no summary.json) and meet every target; a missed target is a failure named
    with its figure, not a crash."""
    if timed_out:
        return FAIL, f"timed out after {timeout_s:.0f} s"
    if returncode != 0:
        return FAIL, f"exit status {returncode}"
    if problem:
        return FAIL, problem
    missed = [describe_target(t) for t in targets if not t["met"]]
    if missed:
        return FAIL, "target missed: " + "; ".join(missed)
    return PASS, ""


def exit_status(results: Sequence[CheckResult]) -> int:
    """0 when every check passed or was skipped, else 1."""
    return 0 if all(r.status in (PASS, SKIPPED) for r in results) else 1


# --- the report --------------------------------------------------------------------------------


def build_report(
    environment: Mapping[str, Any], results: Sequence[CheckResult], options: Mapping[str, Any]
) -> dict:
    """``selfcheck.json``: the machine (every ``ENV_FIELDS`` key, null when unknown), the options,
    and every check; a check's output tail is kept when it failed."""
    checks = []
    for r in results:
        entry = dataclasses.asdict(r)
        entry["tail"] = r.tail if r.status == FAIL else ""
        checks.append(entry)
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIPPED)}
    return {
        **{k: environment.get(k) for k in ENV_FIELDS},
        "options": dict(options),
        "status": PASS if exit_status(results) == 0 else FAIL,
        "counts": counts,
        "checks": checks,
    }


def fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) >= 0.01 or value == 0 else f"{value:.2e}"


def _shown(check: Mapping[str, Any]) -> str:
    names = [n for n in check["shown"] if n in check["figures"]] or list(check["figures"])[:4]
    return ", ".join(f"{n}={fmt(check['figures'][n])}" for n in names)


def _rows(report: Mapping[str, Any]) -> list[list[str]]:
    return [
        [c["name"], c["status"].upper(), f"{c['seconds']:.0f}", _shown(c), c["reason"]]
        for c in report["checks"]
    ]


HEADER = ["check", "status", "s", "figures", "note"]


def _machine_line(report: Mapping[str, Any]) -> str:
    r = {k: fmt(report[k]) for k in ENV_FIELDS}
    return (
        f"{r['device_name']} ({r['device']}), torch {r['torch_version']}, CUDA {r['cuda_version']}, "
        f"driver {r['driver_version']}, flash-attn {r['flash_attn_version']}, triton {r['triton_version']}, "
        f"engine dtype {r['engine_dtype']}, commit {r['git_commit']}"
    )


def render_table(report: Mapping[str, Any]) -> str:
    """The table printed at the end: one row per check, then the verdict."""
    rows = [HEADER, *_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ----")
    counts = report["counts"]
    lines.append(
        f"{report['status'].upper()}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped"
        f" on {report['hostname']}, {_machine_line(report)}"
    )
    return "\n".join(line.rstrip() for line in lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Mapping[str, Any]) -> str:
    """``selfcheck.md``: the machine, the table, then each check's command, figures, targets
    and, for a failure, the end of its output."""
    out = [
        f"# realrl selfcheck: {report['status'].upper()}",
        "",
        f"{report['date']} on {report['hostname']}",
        "",
    ]
    out += ["| field | value |", "|---|---|"]
    out += [f"| {k} | {_cell(fmt(report[k]))} |" for k in ENV_FIELDS]
    out += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in _rows(report)]
    for c in report["checks"]:
        out += ["", f"## {c['name']}: {c['status']}", "", "```", c["command"], "```"]
        if c["reason"]:
            out += ["", c["reason"]]
        if c["figures"]:
            out += ["", "| figure | value |", "|---|---|"]
            out += [f"| {k} | {_cell(fmt(v))} |" for k, v in c["figures"].items()]
        if c["targets"]:
            out += [
                "",
                "targets: "
                + "; ".join(("met: " if t["met"] else "MISSED: ") + describe_target(t) for t in c["targets"]),
            ]
        if c["tail"]:
            out += ["", f"last lines of the output (all of it: `{c['log']}`):", "", "```", c["tail"], "```"]
    return "\n".join(out) + "\n"
