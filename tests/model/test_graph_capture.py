"""CUDA-graph capture of a decoding step runs in the thread-local capture mode: a model worker's
other threads (NCCL's watchdog, gloo's, the request and heartbeat threads) keep calling the CUDA
API while a step is captured, and in the default, global mode such a call invalidates the
capture. On the CPU the capture is made through a stand-in for ``torch.cuda``; on a GPU a step is
captured while another thread keeps launching its own kernels."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch
from model_fixtures import make_hf_model, packed

from realrl.api.core.model_api import GenerationHyperparameters
from realrl.impl.model.nn.generation import generate
from realrl.impl.model.nn.real_model import ReaLModel
from realrl.impl.model.nn.static_decode import DecodeTrace, capture


def recording_cuda(calls: list) -> SimpleNamespace:
    """``torch.cuda``'s ``CUDAGraph`` and ``graph`` as far as ``capture`` uses them, recording
    each capture's keyword arguments and what ran inside it."""

    @contextlib.contextmanager
    def graph(cuda_graph: object, **kwargs):
        calls.append(("enter", cuda_graph, kwargs))
        yield
        calls.append(("exit", cuda_graph))

    return SimpleNamespace(CUDAGraph=object, graph=graph)


def test_capture_is_thread_local():
    calls: list = []
    ran = []
    graph = capture(lambda b: ran.append((b, calls[-1][0])), 4, torch.device("cpu"), recording_cuda(calls))
    assert ran == [(4, "enter")]  # the step ran inside the capture
    assert calls == [("enter", graph, {"capture_error_mode": "thread_local"}), ("exit", graph)]


@pytest.mark.gpu
def test_a_step_is_captured_while_another_thread_launches_kernels(tmp_path):
    make_hf_model("llama").save_pretrained(tmp_path / "m")
    model = ReaLModel.from_pretrained(str(tmp_path / "m"), dtype=torch.bfloat16, device="cuda").eval()
    ids, cu = (t.cuda() for t in packed([17, 1, 40, 9], seed=4))
    keys = torch.arange(4, dtype=torch.long) * 7919
    done, errors = threading.Event(), []

    def busy() -> None:  # its own stream, allocations and syncs: no collective
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                n = 64
                while not done.is_set():
                    x = torch.randn(n, n, device="cuda")
                    (x @ x).sum().item()
                    n = 64 + (n + 32) % 512  # new sizes: the allocator keeps asking for memory
        except Exception as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        trace = DecodeTrace()
        g = GenerationHyperparameters(n=2, max_new_tokens=12, greedy=True, decoding="cuda_graph")
        graphed = generate(model, ids, cu, g, [1, 2, 3], keys, trace)
    finally:
        done.set()
        worker.join()
    assert not errors and trace.captured
    static = GenerationHyperparameters(n=2, max_new_tokens=12, greedy=True, decoding="static")
    want = generate(model, ids, cu, static, [1, 2, 3], keys)
    assert graphed.seqlens == want.seqlens and torch.equal(graphed.sequences, want.sequences)
