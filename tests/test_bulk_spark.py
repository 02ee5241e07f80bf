"""The Spark engine (local[2]) writes the same bytes as the local engine. One small end-to-end run.

Needs pyspark (the `spark` extra) and Java 17+: where either is missing this test fails and says which;
it is never skipped.
"""
from __future__ import annotations

import pytest

from adapter.bulk_spark import SparkUnavailable, check_spark
from tests.bulk_support import assert_same_tree, reference_output, run_bulk


def test_spark_local2_writes_the_same_bytes_as_the_local_engine(tmp_path_factory, tmp_path):
    try:
        check_spark()
    except SparkUnavailable as e:
        pytest.fail(f"the Spark engine cannot be tested here: {e}")
    reference = reference_output(tmp_path_factory)
    assert_same_tree(run_bulk(tmp_path / "out", engine="spark", workers=2, chunk_bytes=64 * 1024), reference)
