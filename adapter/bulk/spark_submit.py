"""`spark-submit adapter/bulk/spark_submit.py IN OUT ...`: runs `deid-adapter bulk ... --engine spark` inside the
submitted application (the master comes from spark-submit)."""
import sys

from adapter.cli.main import app

if __name__ == "__main__":
    app(["bulk", *sys.argv[1:], "--engine", "spark"])
