#!/opt/loom/venv/bin/python3
"""Checks that every metric name in Grafana dashboards and Prometheus rule files is exported.

Usage: check_promql_names.py --metrics NAMES_FILE [--prometheus URL] FILE...
  NAMES_FILE  one metric name per line (e.g. Prometheus' /api/v1/label/__name__/values)
  URL         a running Prometheus (http://127.0.0.1:PORT): every expression, with Grafana's
              variables substituted ($__rate_interval -> 1m, $var -> .*), must evaluate there
              without error (so it parses and its operands match, e.g. no many-to-many joins)
  FILE        a Grafana dashboard (.json: panels[].targets[].expr, nested rows included, and
              templating query variables) or a Prometheus rule file (.yml: groups[].rules[].expr)

Metric names are found with a small PromQL tokenizer: string literals, label matchers {...},
range/subquery brackets [...] and the label lists of by/without/on/ignoring/group_left/
group_right are removed; the remaining identifiers that are not followed by "(" (functions and
aggregations) and are not PromQL keywords or Grafana variables are metric names. Exits 1 naming
every unknown metric with its file and panel/rule, 0 otherwise. Also fails on a dashboard panel
without a query, or a dashboard without uid/title/panels.
"""
import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2",
}
_LABEL_LIST_OPS = ("by", "without", "on", "ignoring", "group_left", "group_right")
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:%s)\s*\([^()]*\)" % "|".join(_LABEL_LIST_OPS))
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?(?:e[+-]?\d+)?[smhdwy]?\b", re.IGNORECASE)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*,)?")


def metric_names(expr):
  """The metric names an expression reads, in order of appearance, without duplicates."""
  s = _STRING.sub(" ", expr)
  s = _GRAFANA_VAR.sub(" ", s)
  s = _BRACES.sub(" ", s)
  s = _BRACKETS.sub(" ", s)
  s = _LABEL_LIST.sub(" ", s)
  s = _NUMBER.sub(" ", s)
  names = []
  for m in _IDENT.finditer(s):
    ident = m.group(0)
    rest = s[m.end():].lstrip()
    if rest.startswith("("):
      continue  # a function or aggregation
    if ident.lower() in KEYWORDS:
      continue
    if ident not in names:
      names.append(ident)
  return names


def template_metric_names(query):
  """Metric names a Grafana templating query reads (label_values(metric, label) or PromQL)."""
  m = _LABEL_VALUES.match(query)
  if m:
    return [m.group(1)] if m.group(1) else []
  return metric_names(query)


def _panels(panels):
  for p in panels:
    yield p
    yield from _panels(p.get("panels", []))


def dashboard_queries(path):
  """(where, expr) of every panel target and query variable; raises ValueError on bad shape."""
  with open(path) as f:
    d = json.load(f)
  for field in ("uid", "title", "panels"):
    if not d.get(field):
      raise ValueError("%s: dashboard has no %s" % (path, field))
  out = []
  ids = set()
  for p in _panels(d["panels"]):
    if p.get("type") in ("row", "text"):
      continue
    if p.get("id") in ids:
      raise ValueError("%s: duplicate panel id %s" % (path, p.get("id")))
    ids.add(p.get("id"))
    exprs = [t.get("expr", "") for t in p.get("targets", [])]
    if not exprs or not all(e.strip() for e in exprs):
      raise ValueError("%s: panel %r has a target without a PromQL expr" % (path, p.get("title")))
    for e in exprs:
      out.append(("panel %r" % p.get("title"), e, metric_names))
  for v in d.get("templating", {}).get("list", []):
    if v.get("type") == "query":
      q = v.get("query")
      q = q.get("query", "") if isinstance(q, dict) else (q or "")
      out.append(("variable %r" % v.get("name"), q, template_metric_names))
  return out


def rule_queries(path):
  import yaml  # python3-yaml; only needed for rule files
  with open(path) as f:
    doc = yaml.safe_load(f)
  out = []
  for g in doc.get("groups", []):
    for r in g.get("rules", []):
      where = "rule %r" % (r.get("alert") or r.get("record"))
      out.append((where, r["expr"], metric_names))
  return out


def substitute_grafana_variables(expr):
  expr = re.sub(r"\$\{?__(rate_)?interval\}?", "1m", expr)
  expr = re.sub(r"\$\{?__range\}?", "1h", expr)
  return _GRAFANA_VAR.sub(".*", expr)


def evaluation_error(prometheus, expr):
  """None if `expr` evaluates on the Prometheus at `prometheus`, else its error message."""
  url = "%s/api/v1/query?%s" % (prometheus, urllib.parse.urlencode({"query": expr}))
  try:
    with urllib.request.urlopen(url, timeout=10) as r:
      body = json.load(r)
  except urllib.error.HTTPError as e:
    body = json.load(e)
  except (urllib.error.URLError, ValueError) as e:
    return "cannot query %s: %s" % (prometheus, e)
  return None if body.get("status") == "success" else body.get("error", str(body))


def main(argv):
  ap = argparse.ArgumentParser()
  ap.add_argument("--metrics", required=True)
  ap.add_argument("--prometheus", default="")
  ap.add_argument("files", nargs="+")
  args = ap.parse_args(argv)
  with open(args.metrics) as f:
    exported = {line.strip() for line in f if line.strip()}
  # Prometheus' own series are always there.
  exported |= {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
  problems = []
  checked = 0
  for path in args.files:
    try:
      queries = dashboard_queries(path) if path.endswith(".json") else rule_queries(path)
    except (ValueError, KeyError, json.JSONDecodeError) as e:
      problems.append(str(e))
      continue
    for where, expr, extract in queries:
      if args.prometheus and extract is metric_names:
        err = evaluation_error(args.prometheus, substitute_grafana_variables(expr))
        if err:
          problems.append("%s: %s does not evaluate: %s\n  %s" % (path, where, err, expr))
      names = extract(expr)
      if not names:
        problems.append("%s: %s reads no metric: %s" % (path, where, expr))
      for n in names:
        checked += 1
        if n not in exported:
          problems.append("%s: %s uses %s, which the cluster does not export" % (path, where, n))
  for p in problems:
    print(p)
  print("checked %d metric references in %d files; %d problems" %
        (checked, len(args.files), len(problems)))
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
