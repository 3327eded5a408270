#!/usr/bin/env python3
"""Counts the test cases of one `bazel test` invocation from its build event protocol file.

Usage: count_tests.py BEP_JSON [--bazel_rc RC]

Only the test targets that this invocation configured are counted, from the test.xml files its
own testResult events name, so a stale test.xml left in bazel-testlogs by an earlier run, a renamed
target or a target outside the invocation changes nothing. Per target:
  - each test case in its test.xml counts as passed, failed (a <failure> or <error>) or skipped;
  - a target whose final attempt did not pass but whose XML shows no failed case (a crash or time
    out that left no XML of its own) adds one failed;
  - a test target with no test result at all (it failed to build, or the build stopped before it
    ran) adds one failed;
  - when Bazel itself exited non-zero and nothing above failed, one failed is added (an analysis
    error outside any test target).
Prints the failing and skipped targets, then the closing line "N passed, N failed, N skipped".
Exit status: 0 when nothing failed, 1 otherwise.

Written by hand because the BEP JSON is one object per line and the standard library reads it;
the event shapes are Bazel's build_event_stream.proto (Bazel 4.2).
"""

import argparse
import collections
import json
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET


def _uri_path(uri):
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return urllib.request.url2pathname(parsed.path)


def _read_events(path):
    events = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"count_tests: {path}:{lineno}: not JSON: {e}")
    return events


def count_cases(xml_path):
    """Returns (passed, failed, skipped) for one JUnit XML file, or None if it is unreadable."""
    try:
        tree = ET.parse(xml_path)
    except (ET.ParseError, OSError):
        return None
    passed = failed = skipped = 0
    for case in tree.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("status", "run") == "notrun":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def tally(events):
    """Returns a dict label -> (passed, failed, skipped, note) for every test target of the run."""
    test_labels = set()
    aborted = {}
    # (label, run, shard) -> (attempt, testResult payload): only the final attempt counts.
    results = {}
    for ev in events:
        ident = ev.get("id", {})
        if "targetConfigured" in ident:
            label = ident["targetConfigured"].get("label")
            kind = ev.get("configured", {}).get("targetKind", "")
            if kind.endswith("_test rule"):
                test_labels.add(label)
            if "aborted" in ev:
                aborted[label] = ev["aborted"].get("description") or ev["aborted"].get("reason")
        elif "targetCompleted" in ident and "aborted" in ev:
            label = ident["targetCompleted"].get("label")
            aborted[label] = ev["aborted"].get("description") or ev["aborted"].get("reason")
        elif "testResult" in ident:
            tid = ident["testResult"]
            key = (tid.get("label"), tid.get("run", 1), tid.get("shard", 1))
            attempt = tid.get("attempt", 1)
            if key not in results or results[key][0] < attempt:
                results[key] = (attempt, ev.get("testResult", {}))

    by_label = collections.defaultdict(list)
    for (label, _, _), (_, payload) in results.items():
        by_label[label].append(payload)

    out = {}
    for label in sorted(test_labels | set(by_label)):
        payloads = by_label.get(label)
        if not payloads:
            why = aborted.get(label) or "no test result (failed to build or did not run)"
            out[label] = (0, 1, 0, why)
            continue
        passed = failed = skipped = 0
        notes = []
        for payload in payloads:
            status = payload.get("status", "NO_STATUS")
            xml = None
            for output in payload.get("testActionOutput", []):
                if output.get("name") == "test.xml":
                    xml = _uri_path(output.get("uri", ""))
            counts = count_cases(xml) if xml else None
            p, f, s = counts if counts else (0, 0, 0)
            if status not in ("PASSED", "FLAKY") and f == 0:
                f = 1
                notes.append(f"status {status} without a failed case in its XML")
            elif counts is None and status in ("PASSED", "FLAKY"):
                p = max(p, 1)  # passed without an XML of its own: one case
            passed += p
            failed += f
            skipped += s
        out[label] = (passed, failed, skipped, "; ".join(notes))
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bep_json")
    parser.add_argument("--bazel_rc", type=int, default=0,
                        help="bazel test's exit status; non-zero with no failure counts one")
    args = parser.parse_args(argv)
    try:
        events = _read_events(args.bep_json)
    except OSError as e:
        events = []
        print(f"count_tests: cannot read {args.bep_json}: {e}", file=sys.stderr)
    per_target = tally(events)
    passed = sum(v[0] for v in per_target.values())
    failed = sum(v[1] for v in per_target.values())
    skipped = sum(v[2] for v in per_target.values())
    for label, (p, f, s, note) in per_target.items():
        if f:
            print(f"FAILED   {label}: {f} failed, {p} passed" + (f" ({note})" if note else ""))
        if s:
            print(f"SKIPPED  {label}: {s} test case(s) skipped")
    if args.bazel_rc != 0 and failed == 0:
        print(f"count_tests: bazel exited {args.bazel_rc} with no failed test: counted as one failure")
        failed = 1
    print(f"{len(per_target)} test targets in this run")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
