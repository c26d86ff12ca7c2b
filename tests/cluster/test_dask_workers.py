"""The cluster executor's worker side: every Dask worker gets its own DuckDB
executor with the kernels, sized from the worker's own threads and memory limit, also a worker that joins
later; a task on a worker without it gets a typed error."""

from __future__ import annotations

import pytest

distributed = pytest.importorskip("distributed")

import tensorsql as ts  # noqa: E402
from tensorsql.backends.dask import worker as W  # noqa: E402
from tensorsql.errors import ExtensionError  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, memory_limit="2GiB", dashboard_address=":0"
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _describe() -> tuple[int, int, list[str]]:
    ex = W.worker_executor()
    return ex.workers, ex.memory_limit, ex.kernel_set.functions()




def test_a_worker_without_the_plugin_gives_a_typed_error(client):
    if W.NAME in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins)):
        client.unregister_worker_plugin(W.NAME)  # its teardown closes every worker's executor
    with pytest.raises(ExtensionError, match="has no tensorsql DuckDB: register the plugin"):
        client.submit(W.worker_executor, pure=False).result()


def test_every_worker_gets_its_own_executor_sized_from_the_worker(client):
    client.register_plugin(W.TensorSQLWorker())
    workers = list(client.scheduler_info()["workers"])
    got = client.gather([client.submit(_describe, pure=False, workers=[w]) for w in workers])
    for threads, limit, functions in got:
        assert threads == 1
        assert limit == int((2 << 30) * W.MEMORY_SHARE)
        assert {"tensor_einsum", "tensor_einsum_agg", "tensor_pack"} <= set(functions)


def test_a_worker_that_joins_later_is_set_up_too(client):
    client.register_plugin(W.TensorSQLWorker())
    client.cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    workers = list(client.scheduler_info()["workers"])
    got = client.gather([client.submit(_describe, pure=False, workers=[w]) for w in workers])
    assert len(got) == 3 and all("tensor_einsum" in f for _, _, f in got)
    client.cluster.scale(2)


def test_worker_limits_follow_the_worker():
    assert W.worker_limits(4, 8 << 30) == (4, int((8 << 30) * W.MEMORY_SHARE))
    threads, limit = W.worker_limits(0, 0, workers_here=4)  # no limit: a share of the machine's
    assert threads == 1 and 0 < limit < ts.backends.duckdb.memory.system_memory()


def test_the_wave_budget_is_not_fixed_before_any_worker_is_set_up():
    """A budget asked before any worker had its DuckDB was cached as unbounded for good: tasks were then
    never cut to fit a worker's memory."""
    from tensorsql.backends.dask import executor as DX

    class Client:
        def __init__(self) -> None:
            self.answers = [{"w": None}, {"w": 4096}]

        def run(self, fn, on_error=None):
            return self.answers.pop(0)

    ex = DX.DaskExecutor.__new__(DX.DaskExecutor)
    ex.client, ex._budget = Client(), None
    assert ex.wave_budget() == 1 << 62
    assert ex.wave_budget() == 4096 and ex._budget == 4096


def test_counts_past_the_cap_are_dropped_oldest_first(monkeypatch):
    """(Two task threads of one worker may drop the same oldest count at once: the loop stops instead of
    failing the task with a KeyError.)"""
    from tensorsql.backends.dask import worker as W

    class State:
        def __init__(self) -> None:
            self.tasks: dict = {}

    class Worker:
        def __init__(self) -> None:
            self.state = State()

        def get_current_task(self):
            return "t-new"

    worker = Worker()
    setattr(worker, W.MOVED, {"t-old": (1, 0)})
    monkeypatch.setattr(W.distributed, "get_worker", lambda: worker)
    monkeypatch.setattr(W, "KEEP_COUNTS", 0)
    W.count_moved([])  # both counts over a cap of 0: dropped, oldest first, without error
    assert getattr(worker, W.MOVED) == {}
