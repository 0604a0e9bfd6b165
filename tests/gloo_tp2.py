"""Run a function on two CPU processes forming a TP=2 group over gloo, for the TP tests.

`run_tp2(worker, *args)` returns `{rank: worker(rank, *args)}`; `worker` must be a module-level
function (it is pickled into the spawned processes) and its result picklable. The workers are
fresh processes: they install the interpreter's FP8 rounding fix and fast paths themselves
(vllm/triton_utils/interpreter_rounding.py, tests/interpreter_fast_paths.py), as the parent's
test session does, and run one intra-op thread each.
"""

import os

import interpreter_fast_paths
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vllm.distributed import destroy_model_parallel, initialize_model_parallel
from vllm.triton_utils import interpreter_rounding


def _entry(rank, port, worker, args, results):
    # CPU workers run the Triton kernels interpreted, unless the parent chose the torch
    # references (`torch_reference_kernels`): spawned workers import Triton (unpickling `worker`)
    # with the parent's environment before this runs, so they must keep its choice.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    interpreter_rounding.install()  # the process ends with the worker: nothing to restore
    interpreter_fast_paths.install()
    # One intra-op thread a rank: two ranks of torch's default (a thread per core) oversubscribe
    # the cores, and a rank whose spinning threads hold a core stalls its peer in every gloo
    # collective (a model test ran 40x slower, far worse on a loaded host).
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        initialize_model_parallel(2)
        results[rank] = worker(rank, *args)
    finally:
        destroy_model_parallel()
        dist.destroy_process_group()


def run_tp2(worker, *args) -> dict:
    # The rendezvous store is bound here, on a port the OS picks, before the ranks start: a port
    # found free and released first could be taken by another test worker in between. It runs
    # a server thread, so it comes after the Manager's process, which forks.
    with mp.Manager() as manager:
        store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        port = store.port
        results = manager.dict()
        mp.spawn(_entry, args=(port, worker, args, results), nprocs=2, join=True)
        return dict(results)
