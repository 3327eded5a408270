#!/opt/loom/venv/bin/python3
"""Tests of bench/alst_search.py's per-rung search (search_rung) against a known maximum.

No trainer runs here: `at(S)` is a fake probe that fits iff S <= the test's maximum (the
trainer-backed probe is bench/capacity_search.probe), and can raise TimeoutError after a given
number of probes, as --deadline_s does. Run: python3 bench/alst_search_test.py
"""
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import alst_search  # noqa: E402
import capacity_search  # noqa: E402


def fake(max_seq, budget_probes=None):
    calls = []

    def at(seq):
        if budget_probes is not None and len(calls) >= budget_probes:
            raise TimeoutError("budget")
        calls.append(seq)
        fit = seq <= max_seq
        return capacity_search.Probe(seq, 0, fit, "fit" if fit else "OOM-killed (1)", seq, 1.0)
    return at, calls


OPTS = types.SimpleNamespace(quantum=16, resolution=0.125, deadline_s=60)


class SearchRungTest(unittest.TestCase):
    def test_baseline_doubles_then_bisects_to_the_resolution(self):
        at, calls = fake(2700)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=1 << 18)
        self.assertEqual(calls[:2], [2048, 4096])
        self.assertEqual(r.status, "max")
        self.assertLessEqual(r.seq, 2700)
        self.assertGreater(r.upper, 2700)
        self.assertLessEqual(r.upper - r.seq, max(16, 0.125 * r.seq))
        self.assertTrue(all(s % 16 == 0 for s in calls))
        self.assertIs(r.probe.layers, r.seq)

    def test_target_fit_is_a_lower_bound_at_the_ceiling(self):
        at, calls = fake(100000)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=41600, known_fit=2560,
                                    target_first=True)
        self.assertEqual(calls, [41600])
        self.assertEqual((r.seq, r.upper, r.status), (41600, None, "ceiling"))
        self.assertIn(">=41600", r.short())

    def test_failed_target_bisects_above_the_rung_below_without_reprobing_it(self):
        at, calls = fake(20000)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=41600, known_fit=2560,
                                    target_first=True)
        self.assertNotIn(2560, calls)
        self.assertNotIn(2048, calls)
        self.assertEqual(r.status, "max")
        self.assertLessEqual(r.seq, 20000)
        self.assertGreater(r.upper, 20000)
        self.assertLessEqual(r.upper - r.seq, 0.125 * r.seq)

    def test_search_ending_on_the_rung_below_measures_it_for_this_rung(self):
        at, calls = fake(2600)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=41600, known_fit=2560,
                                    target_first=True)
        self.assertIn(2560, calls)
        self.assertEqual((r.seq, r.status), (2560, "max"))
        self.assertIsNotNone(r.probe)

    def test_rung_below_not_holding_here_searches_below_it(self):
        at, calls = fake(2300)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=41600, known_fit=2560,
                                    target_first=True)
        self.assertIn(2560, calls)
        self.assertLessEqual(r.seq, 2300)
        self.assertGreaterEqual(r.seq, 2048)
        self.assertIsNotNone(r.probe)

    def test_budget_keeps_the_longest_fit_and_the_first_failure_as_bounds(self):
        at, calls = fake(20000, budget_probes=3)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=41600, known_fit=2560)
        self.assertEqual(calls, [5120, 10240, 20480])
        self.assertEqual((r.seq, r.upper, r.status), (10240, 20480, "budget"))
        self.assertIn(">=10240 <20480 (budget)", r.short())

    def test_budget_before_any_fit_reports_the_rung_below_as_not_probed(self):
        at, calls = fake(20000, budget_probes=1)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=41600, known_fit=2560,
                                    target_first=True)
        self.assertEqual((r.seq, r.probe, r.status), (2560, None, "inherited"))
        self.assertIn("not probed for this rung", r.describe())

    def test_rung_below_failure_is_probed_first_and_brackets_a_rung_that_adds_nothing(self):
        # e.g. checkpoint offload on a CPU node: the rung below's [fit, failure) holds here too.
        at, calls = fake(2600)
        r = alst_search.search_rung(at, OPTS, start=32, ceiling=1 << 18, known_fit=2560,
                                    known_fail=2880)
        self.assertEqual(calls, [2880, 2560])
        self.assertEqual((r.seq, r.upper, r.status), (2560, 2880, "max"))
        self.assertIsNotNone(r.probe)

    def test_rung_below_failure_that_fits_here_doubles_from_it(self):
        at, calls = fake(20000)
        r = alst_search.search_rung(at, OPTS, start=32, ceiling=1 << 18, known_fit=2560,
                                    known_fail=2880)
        self.assertEqual(calls[:4], [2880, 5760, 11520, 23040])
        self.assertEqual(r.status, "max")
        self.assertLessEqual(r.seq, 20000)
        self.assertGreater(r.upper, 20000)
        self.assertLessEqual(r.upper - r.seq, 0.125 * r.seq)
        self.assertNotIn(2560, calls)

    def test_rung_start_skips_the_short_doublings_above_a_short_baseline(self):
        opts = types.SimpleNamespace(quantum=16, resolution=0.125, deadline_s=0, rung_start=1024)
        at, calls = fake(5000)
        r = alst_search.search_rung(at, opts, start=32, ceiling=1 << 18, known_fit=64,
                                    known_fail=80)
        self.assertEqual(calls[:3], [1024, 2048, 4096])  # not the baseline's failure 80 first
        self.assertEqual(r.status, "max")
        self.assertLessEqual(r.seq, 5000)
        self.assertGreater(r.upper, 5000)

    def test_no_fit_at_start(self):
        at, calls = fake(100)
        r = alst_search.search_rung(at, OPTS, start=2048, ceiling=1 << 18)
        self.assertEqual((r.seq, r.status, calls), (0, "none", [2048]))


if __name__ == "__main__":
    unittest.main()
