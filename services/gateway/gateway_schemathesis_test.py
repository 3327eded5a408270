#!/usr/bin/env python3
"""The live gateway against its own OpenAPI document, fuzzed by schemathesis.

Starts a real loom-checkpoint, loom-scheduler and loom-gateway on loopback (port 0, bearer tokens:
tenants team-a and team-b with the user role, ops with the admin role), waits for each one's
/readyz, and then:

  1. Cross-tenant isolation, explicitly: team-a's job is not visible to team-b and cannot be
     cancelled, killed, explained, watched or read (logs, metrics) with team-b's token: 404 with exactly
     the message of a job that does not exist (docs/operations.md section 9); ListJobs as team-b
     leaves it out, even with ?tenant=team-a; the checkpoint routes refuse a user token with 403;
     the job is unchanged afterwards. The same with the roles swapped; then both jobs are
     cancelled by their owners.
  2. schemathesis (scripts/python-requirements.txt) over every route of openapi.json with each
     tenant's token (team-a, team-b, then ops): no 5xx (not_a_server_error), only documented
     status codes (status_code_conformance), bodies and content types as documented
     (response_schema_conformance, content_type_conformance), invalid input refused
     (negative_data_rejection), and, with both tenants as peers, no object of one returned to
     the other (object_level_authorization). Bounded by --max_examples per operation and
     --max_time per run (schemathesis spends all of it), each request by --request-timeout.

A :watch or followed logs (GET .../logs?follow=true) of a live job streams until the job ends,
and nothing runs here (no workers): every job the test knows has ended before the fuzzer starts,
and a job the fuzzer submitted itself would fail the run by its request timeout, not hang it.

  gateway_schemathesis_test.py --checkpoint BIN --scheduler BIN --gateway BIN --openapi DOC
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TOKENS = {
    "team-a": "tok-team-a-3f9c1d",
    "team-b": "tok-team-b-8a2e47",
    "ops": "tok-ops-admin-5b7d",
}
WORKER_TOKEN = "tok-worker-91c0e2"

# A tiny job that validates (tests/testing/tiny_job.h); with no workers it stays PENDING.
TINY_SPEC = {
    "model": {"config": {
        "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
        "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": True}},
    "dataset": {"name": "fortunes"},
    "deepspeed_config": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                         "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                         "zero_optimization": {"stage": 3}},
    "resources": {"num_ranks": 1},
    "training": {"steps": 5, "sequence_length": 16, "seed": 1},
    "checkpoint": {"interval_steps": 5},
}

CHECKS = ",".join([
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "object_level_authorization",
])


class Failure(Exception):
    pass


class Cluster:
    """The three daemons, each started with --ready_file and waited for on its /readyz."""

    def __init__(self, args, tmp, logs):
        self.args, self.tmp, self.logs = args, tmp, logs
        self.procs = {}  # name -> (Popen, log path)

    def start(self):
        tokens = os.path.join(self.tmp, "tokens.yaml")
        with open(tokens, "w") as f:
            f.write("tokens:\n")
            for tenant, token in TOKENS.items():
                role = "admin" if tenant == "ops" else "user"
                f.write("  - {tenant: %s, role: %s, token: %s}\n" % (tenant, role, token))
        worker_token = os.path.join(self.tmp, "worker.token")
        with open(worker_token, "w") as f:
            f.write(WORKER_TOKEN + "\n")
        self.checkpoint_root = os.path.join(self.tmp, "checkpoints")
        os.makedirs(self.checkpoint_root)
        ckpt = self.launch("checkpoint", self.args.checkpoint,
                           "--checkpoint_root=" + self.checkpoint_root,
                           "--auth_tokens_file=" + tokens,
                           "--service_token_file=" + worker_token)
        sched = self.launch("scheduler", self.args.scheduler,
                            "--db=" + os.path.join(self.tmp, "loom.db"),
                            "--checkpoint_root=" + self.checkpoint_root,
                            "--checkpoint_service=" + ckpt["grpc_address"],
                            "--checkpoint_token_file=" + worker_token,
                            "--auth_tokens_file=" + tokens,
                            "--worker_token_file=" + worker_token)
        gw = self.launch("gateway", self.args.gateway,
                         "--scheduler=" + sched["grpc_address"],
                         "--checkpoint=" + ckpt["grpc_address"],
                         "--auth_tokens_file=" + tokens,
                         "--port=0", "--rpc_timeout=10s", "--sse_keepalive=1s")
        self.url = gw["http_url"]
        return self.url

    def launch(self, name, binary, *flags):
        ready_file = os.path.join(self.tmp, name + ".json")
        log = os.path.join(self.logs, name + ".log")
        with open(log, "w") as out:
            proc = subprocess.Popen([binary, "--metrics_port=0", "--ready_file=" + ready_file,
                                     *flags], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = (proc, log)
        # The ready file appears (atomically) once the daemon serves; then its /readyz answers.
        deadline = time.monotonic() + 60
        info = None
        while info is None:
            self.check_alive(name)
            if time.monotonic() > deadline:
                raise Failure("%s wrote no %s within 60 s" % (name, ready_file))
            if os.path.exists(ready_file):
                with open(ready_file) as f:
                    info = json.load(f)
            else:
                time.sleep(0.05)
        ready_url = info["metrics_url"].rsplit("/metrics", 1)[0] + "/readyz"
        while True:
            self.check_alive(name)
            try:
                with urllib.request.urlopen(ready_url, timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise Failure("%s: %s not 200 within 60 s" % (name, ready_url))
            time.sleep(0.05)
        print("%s ready: %s" % (name, json.dumps(info)), flush=True)
        return info

    def check_alive(self, name):
        proc, log = self.procs[name]
        if proc.poll() is not None:
            raise Failure("%s exited with %s; its log:\n%s" % (name, proc.returncode, tail(log)))

    def stop(self):
        for name in ("gateway", "scheduler", "checkpoint"):
            if name not in self.procs:
                continue
            proc, _ = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return str(e)


def call(url, method, path, tenant=None, body=None, timeout=20):
    """(status, parsed JSON body or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    if tenant is not None:
        req.add_header("Authorization", "Bearer " + TOKENS[tenant])
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def expect(cond, what):
    if not cond:
        raise Failure(what)
    print("ok: " + what, flush=True)


def submit(url, tenant, name):
    status, body = call(url, "POST", "/v1/jobs", tenant, {"spec": dict(TINY_SPEC, name=name)})
    expect(status == 200 and body.get("job", {}).get("tenant") == tenant,
           "%s submits job %s (200, tenant %s): %s %s" % (tenant, name, tenant, status,
                                                            json.dumps(body)[:300]))
    return body["job"]["id"]


def cross_tenant(url):
    """Each tenant's job as the other tenant: 404 like a missing one, unchanged afterwards."""
    jobs = {"team-a": submit(url, "team-a", "isolation-a"),
            "team-b": submit(url, "team-b", "isolation-b")}
    missing = "job-00000000"
    for owner, other in (("team-a", "team-b"), ("team-b", "team-a")):
        job = jobs[owner]
        status, before = call(url, "GET", "/v1/jobs/" + job, owner)
        expect(status == 200 and before["id"] == job, "%s reads its job %s" % (owner, job))
        reads = [("GET", "/v1/jobs/%s"), ("GET", "/v1/jobs/%s:explain"),
                 ("GET", "/v1/jobs/%s:watch"), ("GET", "/v1/jobs/%s/logs"),
                 ("GET", "/v1/jobs/%s/logs?follow=true"), ("GET", "/v1/jobs/%s/metrics"),
                 ("POST", "/v1/jobs/%s:cancel"), ("POST", "/v1/jobs/%s:kill")]
        for method, template in reads:
            status, body = call(url, method, template % job, other)
            m_status, m_body = call(url, method, template % missing, other)
            same = (isinstance(body, dict) and isinstance(m_body, dict) and
                    body.get("status") == m_body.get("status") == "NOT_FOUND" and
                    body.get("message") == m_body.get("message", "").replace(missing, job))
            expect(status == 404 and m_status == 404 and same,
                   "%s %s as %s: 404 with the message of a missing job (%s %s / %s %s)" %
                   (method, template % job, other, status, json.dumps(body)[:200], m_status,
                    json.dumps(m_body)[:200]))
        for method, template in [("GET", "/v1/jobs/%s/checkpoints"),
                                 ("GET", "/v1/jobs/%s/checkpoints/0"),
                                 ("DELETE", "/v1/jobs/%s/checkpoints/0"),
                                 ("POST", "/v1/jobs/%s/checkpoints/0:verify"),
                                 ("POST", "/v1/jobs/%s/checkpoints/0:consolidate"),
                                 ("POST", "/v1/jobs/%s/checkpoints:applyRetention")]:
            body = {} if template.endswith("applyRetention") else None
            status, _ = call(url, method, template % job, other, body)
            expect(status == 403, "%s %s as %s (a user token): 403, got %s" %
                   (method, template % job, other, status))
        for query in ("", "?tenant=" + owner, "?page_size=1000"):
            status, body = call(url, "GET", "/v1/jobs" + query, other)
            ids = [j["id"] for j in body.get("jobs", [])] if isinstance(body, dict) else []
            expect(status == 200 and job not in ids and jobs[other] in ids,
                   "GET /v1/jobs%s as %s lists its own job and not %s's (%s)" %
                   (query, other, owner, ids))
        status, after = call(url, "GET", "/v1/jobs/" + job, owner)
        expect(status == 200 and after.get("phase") == before.get("phase") and
               after.get("phase") not in ("JOB_PHASE_CANCELLED", "JOB_PHASE_STOPPING"),
               "%s's job %s is unchanged after %s's attempts (%s)" % (owner, job, other,
                                                                      after.get("phase")))
    # The owner can act on it: cancel answers 200 and the job is then cancelled. Both jobs end
    # here, so that a :watch or followed logs of them that the fuzzer sends ends at once.
    for owner, job in jobs.items():
        status, body = call(url, "POST", "/v1/jobs/%s:cancel" % job, owner)
        expect(status == 200 and body.get("phase") == "JOB_PHASE_CANCELLED",
               "%s cancels its own pending job (200, JOB_PHASE_CANCELLED): %s %s" %
               (owner, status, body.get("phase") if isinstance(body, dict) else body))


def schemathesis(args, url, tenant, tmp, reports):
    """One bounded run with `tenant`'s token, both user tenants as peers; True if it passed."""
    work = os.path.join(tmp, "st-" + tenant)
    os.makedirs(work)
    wfc = os.path.join(work, "auth.json")
    identities = [tenant] + [t for t in ("team-a", "team-b") if t != tenant]
    with open(wfc, "w") as f:
        json.dump({"auth": [{"name": t, "fixedHeaders": [
            {"name": "Authorization", "value": "Bearer " + TOKENS[t]}]} for t in identities]}, f)
    config = os.path.join(work, "schemathesis.toml")
    with open(config, "w") as f:
        f.write('[auth.wfc]\npath = "%s"\nuser = "%s"\npeers = ["team-a", "team-b"]\n' %
                (wfc, tenant))
    command = [
        os.path.join(os.path.dirname(sys.executable), "st"), "--config-file", config, "--no-color",
        "run", args.openapi, "--url", url,
        "--checks", CHECKS,
        "--max-examples", str(args.max_examples),
        "--max-time", str(args.max_time),
        "--request-timeout", "15",
        "--workers", "1",
        "--seed", str(args.seed),
        "--generation-database", "none",
        "--suppress-health-check", "all",
        "--report", "junit",
        "--report-junit-path", os.path.join(reports, "schemathesis-%s.xml" % tenant),
    ]
    print("+ " + " ".join(command), flush=True)
    start = time.monotonic()
    try:
        result = subprocess.run(command, cwd=work, timeout=args.max_time + 60,
                                env=dict(os.environ, HOME=work, NO_COLOR="1"))
        rc = result.returncode
    except subprocess.TimeoutExpired:
        print("schemathesis as %s did not end within %d s" % (tenant, args.max_time + 60))
        rc = -1
    print("schemathesis as %s: exit %d in %.1f s" % (tenant, rc, time.monotonic() - start),
          flush=True)
    return rc == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--scheduler", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--openapi", required=True)
    parser.add_argument("--tenants", default="team-a,team-b,ops",
                        help="whose tokens schemathesis runs with, one run each")
    parser.add_argument("--max_examples", type=int, default=8)
    parser.add_argument("--max_time", type=int, default=30, help="seconds per schemathesis run")
    parser.add_argument("--seed", type=int, default=20261207)
    args = parser.parse_args()
    for attr in ("checkpoint", "scheduler", "gateway", "openapi"):
        setattr(args, attr, os.path.abspath(getattr(args, attr)))

    tmp = tempfile.mkdtemp(prefix="gw-st-", dir=os.environ.get("TEST_TMPDIR"))
    reports = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or os.path.join(tmp, "reports")
    os.makedirs(reports, exist_ok=True)
    cluster = Cluster(args, tmp, reports)
    failed = []
    try:
        url = cluster.start()
        cross_tenant(url)
        for tenant in args.tenants.split(","):
            if not schemathesis(args, url, tenant, tmp, reports):
                failed.append(tenant)
            for name in cluster.procs:
                cluster.check_alive(name)
    except Failure as e:
        print("FAIL: %s" % e, flush=True)
        failed.append("setup or cross-tenant checks")
    finally:
        cluster.stop()
        if failed:
            for name, (_, log) in cluster.procs.items():
                print("--- last lines of %s's log (%s)\n%s" % (name, log, tail(log)))
        if not os.environ.get("TEST_TMPDIR"):
            shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        print("FAIL: %s" % ", ".join(failed))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
