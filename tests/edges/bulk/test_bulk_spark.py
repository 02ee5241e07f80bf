"""The Spark engine (local[2]) writes the same bytes as the local engine, reports refusals, and resumes a
stopped run. Two small end-to-end runs.

Needs pyspark (the `spark` extra) and Java 17+: where either is missing these tests fail and say which;
they are never skipped.
"""
from __future__ import annotations

import json

import pytest

from adapter.bulk.export import deidentify_export
from adapter.bulk.job import SUMMARY_NAME, WORK_DIR
from adapter.bulk.spark import SparkUnavailable, check_spark
from tests.support import TODAY, assert_same_tree, reference_output, refusing_export, run_bulk
from tests.conftest import TEST_SECRET


@pytest.fixture(autouse=True)
def spark_available():
    try:
        check_spark()
    except SparkUnavailable as e:
        pytest.fail(f"the Spark engine cannot be tested here: {e}")


def test_spark_local2_writes_the_same_bytes_as_the_local_engine(tmp_path_factory, tmp_path):
    reference = reference_output(tmp_path_factory)
    assert_same_tree(run_bulk(tmp_path / "out", engine="spark", workers=2, chunk_bytes=64 * 1024), reference)


def test_spark_reports_a_refusal_stops_on_it_with_fail_fast_and_resumes(tmp_path):
    root, _ = refusing_export(tmp_path)
    expected = run_bulk(tmp_path / "local", root, workers=1)
    out = tmp_path / "spark"
    options = dict(today=TODAY, stack="patterns", engine="spark", workers=2, chunk_bytes=64 * 1024, tty=False,
                   log=lambda m: None)
    stopped = deidentify_export(root, out, TEST_SECRET, fail_fast=True, **options)
    assert stopped.stopped and not (out / SUMMARY_NAME).exists() and (out / WORK_DIR).exists()
    resumed = deidentify_export(root, out, TEST_SECRET, **options)
    assert (resumed.refused, resumed.invalid) == (1, 0) and resumed.resumed_chunks >= 1
    assert json.loads((out / SUMMARY_NAME).read_text())["refused"] == {"unknown-modifier-extension": 1}
    assert_same_tree(out, expected)
