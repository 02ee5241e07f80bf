"""The bulk pass 2 as a PySpark job: the same `process_chunk` on executors, one chunk a partition.

The driver keeps everything else (pass 1, the journal, the join), so Spark and the local engine write the
same bytes. Secrets travel as a broadcast variable (never in the job's closures, configuration or logs)
with Spark's local-disk I/O encryption on, and the patient index, whose rows are encrypted, as a Spark
file. On a cluster, IN must be mounted at the same path on every executor, and the executors need this
package installed (or shipped with `--py-files`); OUT is written by the driver only.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

from adapter.bulk import Chunk, ChunkResults, Settings, Worker, process_chunk

SPARK_MISSING = ("the spark engine needs pyspark (pip install 'deid-adapter[spark]') and Java 17 or newer "
                 "(JAVA_HOME, or java on PATH)")

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


def _executor_worker(settings_bc, index_name: str) -> Worker:
    """One Worker per Python worker process, built on its first task (Python workers are reused)."""
    from pyspark import SparkFiles

    local = settings_bc.value
    if _EXECUTOR.get("run") != local.index_key:  # the index key is new each run
        index_path = SparkFiles.get(index_name)
        settings = Settings(local.secret, local.profile, local.stack, local.today, local.validate, index_path,
                            local.index_key, local.llm)
        _EXECUTOR.update(run=local.index_key, worker=Worker.from_settings(settings))
    return _EXECUTOR["worker"]


def _task(root: str, settings_bc, index_name: str):
    def run_partition(chunks: Iterator[Chunk]):
        worker = _executor_worker(settings_bc, index_name)
        for chunk in chunks:
            data, stats = process_chunk(Path(root), chunk, worker)
            yield chunk, data, stats
    return run_partition


@contextlib.contextmanager
def spark_engine(root: Path, settings: Settings, workers: int, master: str | None):
    """A Spark session (local[workers] unless --master or spark-submit says otherwise) and the engine function."""
    check_spark()
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (its packages), not whatever `python3` is first on PATH:
    # pyspark reads PYSPARK_PYTHON when it starts the local workers.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName("deid-adapter bulk")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.io.encryption.enabled", "true")
               .config("spark.python.worker.reuse", "true")
               .config("spark.pyspark.python", sys.executable))
    if master:
        builder = builder.master(master)
    elif not os.environ.get("PYSPARK_GATEWAY_PORT"):  # not under spark-submit: a local session
        builder = builder.master(f"local[{max(workers, 1)}]").config("spark.driver.host", "127.0.0.1")
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    settings_bc = sc.broadcast(settings)
    sc.addFile(settings.index_path)
    index_name = Path(settings.index_path).name

    task = _task(str(root.resolve()), settings_bc, index_name)
    wave = 2 * sc.defaultParallelism  # chunks per job: every core busy, the driver holds at most one wave's output

    def engine_fn(todo: list[Chunk]) -> ChunkResults:
        for start in range(0, len(todo), wave):
            part = todo[start:start + wave]
            yield from sc.parallelize(part, len(part)).mapPartitions(task).collect()

    try:
        yield engine_fn
    finally:
        settings_bc.destroy()
        spark.stop()


if __name__ == "__main__":  # spark-submit adapter/bulk_spark.py IN OUT ... runs the CLI with the spark engine
    from adapter.cli import app

    app(["bulk", *sys.argv[1:], "--engine", "spark"])
