#!/opt/loom/venv/bin/python3
"""Unit tests of check_promql_names.py's PromQL tokenizer and file checks (no cluster needed)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_promql_names as c  # noqa: E402


class MetricNamesTest(unittest.TestCase):

  def test_plain_selector_with_labels(self):
    self.assertEqual(c.metric_names('loom_jobs{phase="PENDING", job=~"loom-.*"}'), ["loom_jobs"])

  def test_functions_aggregations_and_label_lists_are_not_metrics(self):
    expr = ('histogram_quantile(0.99, sum by (le, instance) '
            '(rate(loom_scheduling_cycle_seconds_bucket[5m])))')
    self.assertEqual(c.metric_names(expr), ["loom_scheduling_cycle_seconds_bucket"])

  def test_binary_operators_on_and_keywords(self):
    expr = ('(time() - max by (instance) (loom_trainer_last_step_timestamp_seconds)) > 600 '
            'and on (instance) loom_worker_ranks{state="RANK_STATE_RUNNING"} > 0 '
            'unless ignoring(rank) group_left(job) up offset 5m')
    self.assertEqual(c.metric_names(expr), [
        "loom_trainer_last_step_timestamp_seconds", "loom_worker_ranks", "up"])

  def test_grafana_variables_strings_and_aggregation_after_parens(self):
    expr = ('sum(rate(loom_worker_heartbeats_total{instance=~"$instance"}[$__rate_interval])) '
            'by (result) / ignoring(result) group_left sum(loom_worker_slots) * 1e3')
    self.assertEqual(c.metric_names(expr), ["loom_worker_heartbeats_total", "loom_worker_slots"])

  def test_subquery_and_bool(self):
    self.assertEqual(c.metric_names('max_over_time(loom_trainer_loss[10m:1m]) > bool 3'),
                     ["loom_trainer_loss"])

  def test_label_values_template(self):
    self.assertEqual(c.template_metric_names("label_values(loom_trainer_step, instance)"),
                     ["loom_trainer_step"])
    self.assertEqual(c.template_metric_names("label_values(instance)"), [])


class GrafanaVariablesTest(unittest.TestCase):

  def test_substitution(self):
    self.assertEqual(
        c.substitute_grafana_variables('rate(x{a=~"$job", b=~"${rank}"}[$__rate_interval])'),
        'rate(x{a=~".*", b=~".*"}[1m])')


class FileCheckTest(unittest.TestCase):

  def run_check(self, dashboard, names):
    with tempfile.TemporaryDirectory() as d:
      dpath = os.path.join(d, "dash.json")
      npath = os.path.join(d, "names.txt")
      with open(dpath, "w") as f:
        json.dump(dashboard, f)
      with open(npath, "w") as f:
        f.write("\n".join(names) + "\n")
      return c.main(["--metrics", npath, dpath])

  DASH = {"uid": "x", "title": "X", "panels": [
      {"id": 1, "type": "row", "title": "r", "panels": [
          {"id": 2, "type": "timeseries", "title": "loss",
           "targets": [{"expr": "loom_trainer_loss"}]}]},
      {"id": 3, "type": "stat", "title": "jobs", "targets": [{"expr": "sum(loom_jobs)"}]}]}

  def test_known_names_pass(self):
    self.assertEqual(self.run_check(self.DASH, ["loom_trainer_loss", "loom_jobs"]), 0)

  def test_unknown_name_in_nested_panel_fails(self):
    self.assertEqual(self.run_check(self.DASH, ["loom_jobs"]), 1)

  def test_panel_without_query_fails(self):
    dash = json.loads(json.dumps(self.DASH))
    dash["panels"][1]["targets"] = [{"expr": ""}]
    self.assertEqual(self.run_check(dash, ["loom_trainer_loss", "loom_jobs"]), 1)


if __name__ == "__main__":
  unittest.main()
