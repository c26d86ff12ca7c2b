"""A worker's tasks run again over the same inputs as statements prepared once (``backends.dask.prepared``),
on one DuckDB connection in this process: the first run is fresh, the second prepares, later ones execute
the prepared statement; other input objects, a released key, a busy cursor, a full store, a statement that
does not prepare or no longer runs, and a closed store each fall back to a fresh run with the same result."""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import pytest

from tensorsql.backends.dask import prepared as P

SQL = 'SELECT SUM("v") * 2 AS "s" FROM "_ts_in_0"'


class Task:
    """One task's inputs and a count of its fresh runs and registrations."""

    def __init__(self, con: duckdb.DuckDBPyConnection, values: list[int], key: str = "k1") -> None:
        self.con = con
        self.table = pa.table({"v": values})
        self.key = key
        self.fresh_runs = 0
        self.registered = 0

    def register(self, cur) -> None:
        self.registered += 1
        cur.register("_ts_in_0", self.table)

    def fresh(self) -> pa.Table:
        self.fresh_runs += 1
        cur = self.con.cursor()
        try:
            self.register(cur)
            return cur.sql(SQL).to_arrow_table()
        finally:
            cur.close()

    def run(self, store: P.PreparedTasks, sql: str = SQL) -> int:
        out = store.run((sql, self.key), [self.key], [self.table], self.register, self.fresh)
        return out.column("s")[0].as_py()


@pytest.fixture
def con():
    c = duckdb.connect()
    yield c
    c.close()


def test_a_task_prepares_on_its_second_run_and_then_only_executes(con):
    store = P.PreparedTasks(con)
    task = Task(con, [1, 2, 3])
    assert task.run(store) == 12 and (task.fresh_runs, task.registered, len(store)) == (1, 1, 0)
    assert task.run(store) == 12 and (task.fresh_runs, task.registered, len(store)) == (1, 2, 1)
    for _ in range(3):
        assert task.run(store) == 12
    assert (task.fresh_runs, task.registered) == (1, 2)  # no registration, no fresh run: the prepared one


def test_other_input_objects_under_the_same_key_are_read_anew(con):
    """A lost key computed again is another table: the kept cursor, which holds the old one, is not used."""
    store = P.PreparedTasks(con)
    task = Task(con, [1, 2, 3])
    task.run(store), task.run(store)
    task.table = pa.table({"v": [10, 20]})
    assert task.run(store) == 60  # prepared again over the new table
    assert task.run(store) == 60 and task.registered == 3 and len(store) == 1


def test_a_released_key_takes_its_cursors_along(con):
    store = P.PreparedTasks(con)
    a, b = Task(con, [1], key="a"), Task(con, [2], key="b")
    for t in (a, b, a, b):
        t.run(store)
    assert len(store) == 2
    store.released("a")
    store.released("never-seen")
    assert len(store) == 1
    assert a.run(store) == 2 and a.registered == 3  # seen before: prepared again at once
    assert len(store) == 2


def test_a_busy_cursor_is_not_shared_and_a_second_task_runs_fresh(con):
    store = P.PreparedTasks(con)
    task = Task(con, [5])
    task.run(store), task.run(store)
    entry = store._entries[(SQL, "k1")]
    entry.busy = True  # another thread is running it
    assert task.run(store) == 10 and task.fresh_runs == 2
    entry.busy = False
    assert task.run(store) == 10 and task.fresh_runs == 2


def test_threads_running_the_same_task_at_once_all_get_its_result(con):
    store = P.PreparedTasks(con)
    task = Task(con, list(range(100)))
    errors, results = [], []

    def run() -> None:
        try:
            results.extend(task.run(store) for _ in range(20))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and results == [9900] * 80 and len(store) == 1


def test_the_store_keeps_at_most_its_entries_the_least_recently_used_out(con, monkeypatch):
    monkeypatch.setattr(P, "ENTRIES", 2)
    store = P.PreparedTasks(con)
    tasks = [Task(con, [i], key=f"k{i}") for i in range(3)]
    for t in tasks + tasks:
        t.run(store)
    assert len(store) == 2 and (SQL, "k0") not in store._entries
    assert set(store._by_key) == {"k1", "k2"}


def test_a_statement_that_does_not_prepare_runs_fresh_from_then_on(con):
    store = P.PreparedTasks(con)
    task = Task(con, [1, 2])
    bad = 'SELECT SUM("v") AS "s" FROM "_ts_in_1"'  # reads a view the cursor does not have: does not bind

    def fresh() -> pa.Table:
        task.fresh_runs += 1
        return pa.table({"s": [6]})

    for _ in range(4):
        out = store.run((bad, "k1"), ["k1"], [task.table], task.register, fresh)
        assert out.column("s")[0].as_py() == 6
    assert task.fresh_runs == 4 and len(store) == 0


def test_a_prepared_statement_that_fails_runs_fresh_and_is_dropped(con):
    store = P.PreparedTasks(con)
    task = Task(con, [1, 2])
    task.run(store), task.run(store)
    entry = store._entries[(SQL, "k1")]
    entry.execute = 'EXECUTE "no_such_statement"'
    assert task.run(store) == 6 and task.fresh_runs == 2 and len(store) == 0
    assert entry.cursor is None  # closed
    assert task.run(store) == 6 and task.fresh_runs == 3 and len(store) == 0  # refused from then on


def test_a_data_error_of_the_prepared_run_is_raised_not_hidden(con):
    """A kernel's check fails as an InvalidInputException: the data's fault, raised as in a fresh run."""
    store = P.PreparedTasks(con)
    sql = "SELECT error('bad block') AS \"s\" FROM \"_ts_in_0\""
    task = Task(con, [1])

    def fresh() -> pa.Table:
        cur = con.cursor()
        task.register(cur)
        return cur.sql(sql).to_arrow_table()

    for _ in range(3):
        with pytest.raises(duckdb.InvalidInputException, match="bad block"):
            store.run((sql, "k1"), ["k1"], [task.table], task.register, fresh)
    assert len(store) == 1  # the statement is fine: kept


def test_a_closed_store_runs_fresh_and_closes_its_cursors(con):
    store = P.PreparedTasks(con)
    task = Task(con, [4])
    task.run(store), task.run(store)
    cursor = store._entries[(SQL, "k1")].cursor
    store.close()
    assert len(store) == 0 and store.closed
    with pytest.raises(duckdb.ConnectionException):
        cursor.sql("SELECT 1")
    assert task.run(store) == 8 and task.fresh_runs == 2
