"""The bulk pass 2 as a PySpark job: the same `process_chunk` on executors, a few chunks a partition.

The driver keeps everything else (pass 1, the journal, the join), so Spark and the local engine write the
same bytes. The chunks are one RDD whose partitions are runs of consecutive chunks: a Spark task costs a
round trip between the JVM and a Python worker, so tasks should be long, yet a few per core keep every core
busy to the end. Each partition runs as its own job, two per core at a time, so a core always has its next
task waiting, each result reaches the journal as soon as its task ends, and the driver holds no more than
those jobs' output. Secrets travel as a broadcast variable (never in the job's closures, configuration or
logs) with Spark's local-disk I/O encryption on, and the patient index, whose rows are encrypted, as a
Spark file. On a cluster, IN must be mounted at the same path on every executor, and the executors need
this package installed (or shipped with `--py-files`); OUT is written by the driver only.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import itertools
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

from adapter.bulk.job import Chunk, ChunkResults, Settings, Worker, in_completion_order, process_chunk
from text_deid.stack import LlmSettings, TextStack
from adapter.engines import text_stack

SPARK_MISSING = ("the spark engine needs pyspark (pip install 'deid-adapter[spark]') and Java 17 or newer "
                 "(JAVA_HOME, or java on PATH)")

TASKS_PER_CORE = 4  # at least this many partitions per core, so that the last ones end close together
MAX_CHUNKS_PER_TASK = 4  # and at most this many chunks in one: the driver holds a task's output until it ends

_EXECUTOR: dict = {}


class SparkUnavailable(RuntimeError):
    """pyspark or Java is missing: the run stops with exit 2 and says which."""


def check_spark() -> None:
    """Raise SparkUnavailable naming what is missing (never fall back to the local engine silently)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SparkUnavailable(f"pyspark is not installed: {SPARK_MISSING}") from None
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and not shutil.which("java"):
        raise SparkUnavailable(f"no Java found: {SPARK_MISSING}")


def _executor_stack(stack: str, llm: LlmSettings | None) -> TextStack:
    """The text stack of this Python worker process: it holds no secret, so every run reuses it."""
    stacks = _EXECUTOR.setdefault("stacks", {})
    if (stack, llm) not in stacks:
        stacks[stack, llm] = text_stack(stack, llm)
    return stacks[stack, llm]


def _executor_worker(settings_bc, index_name: str) -> Worker:
    """One Worker per Python worker process, built on its first task (Python workers are reused)."""
    from pyspark import SparkFiles

    local = settings_bc.value
    if _EXECUTOR.get("run") != local.index_key:  # the index key is new each run
        settings = dataclasses.replace(local, index_path=SparkFiles.get(index_name))
        _EXECUTOR.update(run=local.index_key, worker=Worker.from_settings(settings, _executor_stack(local.stack, local.llm)))
    return _EXECUTOR["worker"]


def _warm_up(stack: str, llm: LlmSettings | None):
    def build(_) -> None:
        _executor_stack(stack, llm)
    return build


def _task(root: str, settings_bc, index_name: str):
    def run_partition(chunks: Iterator[Chunk]):
        worker = _executor_worker(settings_bc, index_name)
        for chunk in chunks:
            data, stats = process_chunk(Path(root), chunk, worker)
            yield chunk, data, stats
    return run_partition


@contextlib.contextmanager
def spark_engine(root: Path, settings: Settings, workers: int, master: str | None):
    """The engine function, on a Spark context that starts at once in the background: the JVM comes up while
    the driver runs pass 1, which must end before the engine function is called (it ships the index)."""
    check_spark()
    with cf.ThreadPoolExecutor(1, thread_name_prefix="spark-start") as starter:
        starting = starter.submit(_start_context, workers, master, settings)
        try:
            yield lambda todo: _run_chunks(starting.result(), root, settings, todo)
        finally:
            if starting.exception() is None:
                starting.result().stop()


def _start_context(workers: int, master: str | None, settings: Settings):
    """A Spark context (local[workers] unless --master or spark-submit says otherwise) whose Python workers
    have started and built the text stack (imports and patterns: seconds each), as pass 1 runs."""
    from pyspark import SparkConf, SparkContext

    # Python workers must run this interpreter (its packages), not whatever `python3` is first on PATH:
    # pyspark reads PYSPARK_PYTHON when it starts the local workers.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # A bare SparkContext: the job is RDDs only, and a SparkSession would start Spark SQL for nothing.
    conf = (SparkConf().setAppName("deid-adapter bulk")
            .set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.io.encryption.enabled", "true")
            .set("spark.python.worker.reuse", "true")
            .set("spark.pyspark.python", sys.executable)
            # The driver JVM schedules and relays bytes; Python does the work. C2's compiler threads would
            # cost it more CPU than they save (about half its CPU time here), so it stops at C1.
            .setIfMissing("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1"))
    if master:
        conf.setMaster(master)
    elif not os.environ.get("PYSPARK_GATEWAY_PORT"):  # not under spark-submit: a local context
        conf.setMaster(f"local[{max(workers, 1)}]").set("spark.driver.host", "127.0.0.1")
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    # one task per core; a worker this misses builds its stack on its first chunk
    sc.parallelize(range(sc.defaultParallelism), sc.defaultParallelism).foreach(_warm_up(settings.stack, settings.llm))
    return sc


def _run_chunks(sc, root: Path, settings: Settings, todo: list[Chunk]) -> ChunkResults:
    """Pass 2 on `sc`: the secrets as a broadcast, the index as a Spark file, partitions run as jobs."""
    if not todo:
        return
    settings_bc = sc.broadcast(settings)
    sc.addFile(settings.index_path)
    task = _task(str(root.resolve()), settings_bc, Path(settings.index_path).name)
    tasks = min(len(todo), max(TASKS_PER_CORE * sc.defaultParallelism, -(-len(todo) // MAX_CHUNKS_PER_TASK)))
    chunks = sc.parallelize(todo, tasks)  # partition i: a run of consecutive chunks
    in_flight = 2 * sc.defaultParallelism

    def run_job(partition: int) -> list[tuple[Chunk, bytes, dict]]:
        return sc.runJob(chunks, task, [partition])

    try:
        with cf.ThreadPoolExecutor(in_flight, thread_name_prefix="spark-job") as jobs:
            try:
                done = in_completion_order(lambda partition: jobs.submit(run_job, partition), range(tasks), in_flight)
                yield from itertools.chain.from_iterable(done)
            finally:
                sc.cancelAllJobs()  # stopped early (--fail-fast, an error): nothing left running
    finally:
        settings_bc.destroy()
