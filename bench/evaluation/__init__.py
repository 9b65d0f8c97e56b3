"""The evaluation harness behind ``bench/evaluate.py``, in three parts imported one way:
``grid`` (the grid file, its datasets and configurations, the policies' flags), ``harness`` (the
runs, classifiers, DistDGL peer and simulator; imports ``grid``) and ``report`` (results.json and
results.md, the prose of the latter in ``report_template.md``; imports ``grid`` and the harness's
``figures`` to rebuild a report from the logs)."""
