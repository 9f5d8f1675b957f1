"""One process of the fleet benchmark's LangGraph anchor; runs in bench/.venvs/langgraph, started by fleet_langgraph.py.

    python fleet_langgraph_child.py DSN SAVER K PROCESSES SESSIONS IN_FLIGHT SIDE_LOG

Runs the sessions ``n`` of ``range(SESSIONS)`` with ``n % PROCESSES == K`` (LangGraph has no queue:
the split is static), ``IN_FLIGHT`` at a time, each session one ``thread_id`` invoked once to
completion: ten steps of a ``decide`` node and a ``record`` node (the non-idempotent tool of
``tests/fleet_app.py``: ``begin``/``end`` lines appended to ``SIDE_LOG``), ``durability="sync"``.
SAVER ``sync``: ``PostgresSaver`` on a ``psycopg_pool.ConnectionPool`` shared by ``IN_FLIGHT``
threads; ``async``: ``AsyncPostgresSaver`` on an ``AsyncConnectionPool`` shared by ``IN_FLIGHT``
tasks. Protocol on stdout: ``READY`` once imported, connected and set up; it then waits for one line
on stdin, runs, prints ``DONE``, checks every thread's final state and prints a JSON summary
(its wall and CPU seconds, how many threads it checked and how many did not end at ten steps).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = ["main"]

STEPS = 10
POOL_KWARGS = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


class State(TypedDict):
    """The session: its task, how many steps are done out of ``target``, the step chosen to run."""

    task: str
    target: int
    done: int
    step: int


def build(side_log: str) -> StateGraph:
    """decide -> record -> decide ... -> END, the fleet agent's loop."""

    def log(line: str) -> None:
        if side_log:
            with open(side_log, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def decide(state: State) -> dict[str, Any]:
        return {"step": state["done"]}

    def record(state: State) -> dict[str, Any]:
        log(f"begin {state['task']} {state['step']}")
        log(f"end {state['task']} {state['step']}")
        return {"done": state["done"] + 1}

    graph = StateGraph(State)
    graph.add_node("decide", decide)
    graph.add_node("record", record)
    graph.add_edge(START, "decide")
    graph.add_conditional_edges("decide", lambda s: END if s["done"] >= s["target"] else "record")
    graph.add_edge("record", "decide")
    return graph


def _config(task: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": task}, "recursion_limit": 4 * STEPS + 10}


def _inputs(task: str) -> State:
    return {"task": task, "target": STEPS, "done": 0, "step": 0}


def _wait_go() -> None:
    print("READY", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("the parent closed stdin before the start")


def _finish(elapsed: float, cpu: float, finals: list[int]) -> None:
    bad = sum(1 for done in finals if done != STEPS)
    print(json.dumps({"elapsed": elapsed, "cpu": cpu, "bad": bad, "checked": len(finals)}), flush=True)


def run_sync(dsn: str, tasks: list[str], in_flight: int, side_log: str) -> None:
    """Threads sharing one pool and one ``PostgresSaver``."""
    with ConnectionPool(dsn, min_size=in_flight, max_size=in_flight, kwargs=POOL_KWARGS) as pool:
        pool.wait()
        saver = PostgresSaver(pool)
        saver.setup()
        app = build(side_log).compile(checkpointer=saver)

        def one(task: str) -> None:
            app.invoke(_inputs(task), _config(task), durability="sync")

        with ThreadPoolExecutor(max_workers=in_flight) as executor:
            _wait_go()
            start, cpu = time.perf_counter(), time.process_time()
            list(executor.map(one, tasks))
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        print("DONE", flush=True)
        finals = [app.get_state(_config(task)).values["done"] for task in tasks]
    _finish(elapsed, cpu, finals)


async def run_async(dsn: str, tasks: list[str], in_flight: int, side_log: str) -> None:
    """``in_flight`` tasks sharing one pool and one ``AsyncPostgresSaver``."""
    async with AsyncConnectionPool(dsn, min_size=in_flight, max_size=in_flight, kwargs=POOL_KWARGS) as pool:
        await pool.wait()
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        app = build(side_log).compile(checkpointer=saver)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for task in tasks:
            queue.put_nowait(task)

        async def runner() -> None:
            while not queue.empty():
                task = queue.get_nowait()
                await app.ainvoke(_inputs(task), _config(task), durability="sync")

        await asyncio.to_thread(_wait_go)
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(runner() for _ in range(in_flight)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        print("DONE", flush=True)
        finals = [(await app.aget_state(_config(task))).values["done"] for task in tasks]
    _finish(elapsed, cpu, finals)


def main() -> None:
    """Parse the arguments and run this process's share."""
    dsn, saver, k, processes, sessions, in_flight, side_log = sys.argv[1:8]
    tasks = [f"lg-{n}" for n in range(int(sessions)) if n % int(processes) == int(k)]
    if saver == "sync":
        run_sync(dsn, tasks, int(in_flight), side_log)
    elif saver == "async":
        asyncio.run(run_async(dsn, tasks, int(in_flight), side_log))
    else:
        raise SystemExit(f"unknown saver {saver!r} (sync or async)")


if __name__ == "__main__":
    main()
