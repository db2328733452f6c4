"""The Grafana dashboard (deploy/k8s/monitoring/substrax-dashboard.json) against a live coordinator.

Starts a real coordinator (plaintext, /metrics on a free port) and a real worker daemon with one
CPU device, submits a job with substraxctl so that the scheduler places an attempt, and scrapes
/metrics until the placement is observed. Then: the dashboard parses as JSON, is the schema it
claims (schemaVersion, a Prometheus `datasource` variable that every panel and query uses), and
every metric name in every PromQL expression (panel targets and query variables) is a family the
coordinator exports (a `# TYPE` line of the scrape; `_bucket`, `_sum` and `_count` of a histogram
family count as that family).

Run by //tests/monitoring:dashboard_test. Arguments: --coordinator, --worker, --ctl (the
binaries), --dashboard (the JSON file), --spec (a job spec for one CPU device).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import outlived  # noqa: E402  (tests/outlived.py)

ARGS = None
DEADLINE_S = 60
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# The coordinator's --queues: a queue with a quota, so that every queue family is exported.
QUEUES = """queues:
  - name: research
    quotas: [{backend: cpu, devices: 4}]
"""
# PromQL words that are not metric names: operators, modifiers, aggregation clauses.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "atan2", "inf", "nan"}


def MetricNames(expr):
    """The metric names a PromQL expression reads: identifiers left once string literals, label
    matchers, range and offset durations and the label lists of by/without/on/ignoring/group_*
    are removed, that are not function calls, keywords or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w$.:])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def Families(scrape):
    """{family name: type} from the `# TYPE name type` lines of a Prometheus text scrape."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", scrape, re.MULTILINE))


def Sample(scrape, name, labels=""):
    """The value of the sample `name{labels}` (labels as printed, e.g. 'attempt="first"'), or
    None."""
    series = "%s{%s}" % (name, labels) if labels else name
    for line in scrape.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def Unexported(names, families):
    """The names that are no exported family (nor a histogram family's series)."""
    missing = set()
    for name in names:
        if name in families:
            continue
        base = next((name[:-len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        if base is not None and families.get(base) == "histogram":
            continue
        missing.add(name)
    return missing


def Expressions(dashboard):
    """(where, PromQL) for every panel target and every query variable."""
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            yield "panel %r target %s" % (panel.get("title"), target.get("refId")), target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            for inner in re.findall(r"label_values\((.*),\s*\w+\)\s*$", query) or [query]:
                yield "variable %s" % var["name"], inner


def Wait(condition, what, process_logs):
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("no %s within %d s\n%s" % (what, DEADLINE_S, process_logs()))
        time.sleep(0.1)  # polling, bounded by the deadline


class MetricNamesTest(unittest.TestCase):
    """The parser the live test relies on."""

    def testNamesOutOfExpressions(self):
        self.assertEqual(MetricNames(
            'histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x=~"$v", le!="1"}'
            '[$__rate_interval])))'), {"a_seconds_bucket"})
        self.assertEqual(MetricNames('sum(b{use="all"}) - ignoring(use) sum(c{use="busy"})'),
                         {"b", "c"})
        self.assertEqual(MetricNames('sum by (state) (d) and on (state) e offset 5m'),
                         {"d", "e"})
        self.assertEqual(MetricNames('rate(f_total[5m]) > bool 0.5e3'), {"f_total"})

    def testHistogramSeriesCountAsTheirFamily(self):
        families = {"h_seconds": "histogram", "g": "gauge"}
        self.assertEqual(Unexported({"h_seconds_bucket", "h_seconds_count", "g", "g_sum",
                                     "nope"}, families), {"g_sum", "nope"})


class LiveDashboardTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dashboard-", dir=os.environ.get("TEST_TMPDIR"))
        cls.processes = []
        address_file = os.path.join(cls.tmp, "address")
        cls.coordinator_log = os.path.join(cls.tmp, "coordinator.log")
        queues = os.path.join(cls.tmp, "queues.yaml")
        with open(queues, "w") as f:
            f.write(QUEUES)
        cls.Start([ARGS.coordinator, "--insecure", "--listen", "127.0.0.1:0",
                   "--metrics-listen", "127.0.0.1:0", "--state-dir",
                   os.path.join(cls.tmp, "state"), "--address-file", address_file,
                   "--queues", queues],
                  cls.coordinator_log)

        def Serving():
            with open(cls.coordinator_log) as f:
                m = re.search(r"metrics on (\S+?),", f.read())
            return m and os.path.exists(address_file) and m.group(1)

        cls.metrics = Wait(Serving, "metrics address in the coordinator's log", cls.Logs)
        with open(address_file) as f:
            cls.address = f.read().strip()
        cls.Start([ARGS.agent, "--insecure", "--coordinator", cls.address,
                   "--cpu-devices", "1", "--worker-id", "w-1", "--host", "host-a", "--work-dir",
                   os.path.join(cls.tmp, "worker")], os.path.join(cls.tmp, "worker.log"))
        Wait(lambda: Sample(cls.Scrape(), "substrax_workers", 'state="alive"') == 1,
             "alive worker in substrax_workers", cls.Logs)
        # One device: placed as soon as the worker's device is free.
        submit = subprocess.run([ARGS.ctl, "--insecure", "--coordinator", cls.address, "submit",
                                 ARGS.spec], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=DEADLINE_S, check=False)
        if submit.returncode != 0:
            raise AssertionError("substraxctl submit: %s\n%s" % (submit.stdout, cls.Logs()))

        def Placed():
            scrape = cls.Scrape()
            count = Sample(scrape, "substrax_scheduling_latency_seconds_count", 'attempt="first"')
            return scrape if count and count >= 1 else None

        cls.scrape = Wait(Placed, "placement in substrax_scheduling_latency_seconds", cls.Logs)
        with open(ARGS.dashboard, encoding="utf-8") as f:
            cls.text = f.read()

    @classmethod
    def tearDownClass(cls):
        for process, log in reversed(cls.processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
            log.close()
        outlived.assert_none_outlived(cls.tmp)

    @classmethod
    def Start(cls, argv, log_path):
        log = open(log_path, "w")
        cls.processes.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))

    @classmethod
    def Logs(cls):
        out = []
        for name in sorted(os.listdir(cls.tmp)):
            if name.endswith(".log"):
                with open(os.path.join(cls.tmp, name)) as f:
                    out.append("--- %s ---\n%s" % (name, f.read()[-4000:]))
        return "\n".join(out)

    @classmethod
    def Scrape(cls):
        with urllib.request.urlopen("http://%s/metrics" % cls.metrics, timeout=10) as r:
            return r.read().decode("utf-8")

    def testTheHistogramSawThePlacement(self):
        families = Families(self.scrape)
        self.assertEqual(families.get("substrax_scheduling_latency_seconds"), "histogram")
        self.assertGreaterEqual(Sample(self.scrape, "substrax_jobs_submitted_total"), 1)
        # Placed within a few ticks of the submit: below the 10 s bucket.
        self.assertEqual(
            Sample(self.scrape, "substrax_scheduling_latency_seconds_bucket",
                   'attempt="first",le="10"'),
            Sample(self.scrape, "substrax_scheduling_latency_seconds_count", 'attempt="first"'))
        self.assertEqual(Sample(self.scrape, "substrax_scheduling_latency_seconds_count",
                                'attempt="restart"'), 0)

    def testDashboardIsGrafanaJsonOnOnePrometheusDatasource(self):
        dashboard = json.loads(self.text)
        self.assertGreaterEqual(dashboard["schemaVersion"], 39)
        self.assertTrue(dashboard.get("uid"))
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        errors = []
        for panel in dashboard["panels"]:
            for where, ds in [("panel", panel.get("datasource"))] + [
                    ("target " + t.get("refId", "?"), t.get("datasource"))
                    for t in panel.get("targets", [])]:
                if ds != {"type": "prometheus", "uid": "${datasource}"}:
                    errors.append("panel %r %s: datasource %s, want the ${datasource} variable" %
                                  (panel.get("title"), where, ds))
            if not panel.get("targets"):
                errors.append("panel %r has no query" % panel.get("title"))
        ids = [p["id"] for p in dashboard["panels"]]
        if len(set(ids)) != len(ids):
            errors.append("panel ids repeat: %s" % ids)
        if errors:
            self.fail("\n".join(errors))

    def testEveryMetricTheDashboardReadsIsExported(self):
        dashboard = json.loads(self.text)
        families = Families(self.scrape)
        errors = []
        used = set()
        for where, expr in Expressions(dashboard):
            names = MetricNames(expr)
            used |= names
            if not names:
                errors.append("%s: no metric in %r" % (where, expr))
            for name in sorted(Unexported(names, families)):
                errors.append("%s: %s is not exported by the coordinator (%r)" % (where, name,
                                                                                  expr))
        if errors:
            self.fail("\n".join(errors) + "\nexported: %s" % sorted(families))
        # The panels the dashboard promises.
        for want in ("substrax_jobs", "substrax_workers", "substrax_devices",
                     "substrax_step_reports_total", "substrax_scheduling_latency_seconds_bucket",
                     "substrax_queue_used_devices", "substrax_queue_quota_devices",
                     "substrax_queue_pending_jobs"):
            self.assertIn(want, used)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    for flag in ("--coordinator", "--agent", "--ctl", "--dashboard", "--spec"):
        parser.add_argument(flag, required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
