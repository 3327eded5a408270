#!/opt/loom/venv/bin/python3
"""Generates the Grafana dashboards in deploy/grafana/*.json (the checked-in JSON is its output).

Usage: generate_dashboards.py [OUT_DIR]   (default: the directory of this script)

Edit the panels here and rerun; //deploy:dashboards_test fails when the JSON files and this
script disagree, and //tests/observability:prometheus_scrape_test checks every query against a
live cluster and Prometheus. Grafana schema 37 (Grafana 9+); the data source is the
`datasource` variable, so the files import into any Grafana with a Prometheus data source.
"""
import json
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
DS = {"type": "prometheus", "uid": "${datasource}"}

def templ(extra=()):
    lst = [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus",
            "current": {}, "hide": 0}]
    for name, q, label in extra:
        lst.append({"name": name, "type": "query", "datasource": DS, "label": label,
                    "query": {"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                    "definition": q, "refresh": 2, "includeAll": True, "multi": True,
                    "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "sort": 1})
    return {"list": lst}

class Dash:
    def __init__(self):
        self.panels = []; self.y = 0; self.x = 0; self.id = 1; self.rowh = 0
    def row(self, title):
        if self.x: self.y += self.rowh; self.x = 0
        self.panels.append({"id": self.id, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.id += 1; self.y += 1
    def panel(self, title, targets, kind="timeseries", unit=None, w=12, h=8, desc=""):
        if self.x + w > 24: self.y += self.rowh; self.x = 0
        p = {"id": self.id, "type": kind, "title": title, "datasource": DS,
             "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
             "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": l, "datasource": DS}
                         for i, (e, l) in enumerate(targets)],
             "fieldConfig": {"defaults": {"unit": unit or "short"}, "overrides": []},
             "options": {}}
        if desc: p["description"] = desc
        if kind == "timeseries":
            p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}}
        if kind == "stat":
            p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                            "colorMode": "value", "graphMode": "area"}
        self.panels.append(p); self.id += 1; self.x += w; self.rowh = h
    def write(self, fname, uid, title, desc, variables=(), tags=("loom",)):
        d = {"uid": uid, "title": title, "description": desc, "tags": list(tags),
             "editable": True, "schemaVersion": 37, "version": 1, "time": {"from": "now-6h", "to": "now"},
             "refresh": "30s", "timezone": "", "templating": templ(variables),
             "annotations": {"list": []}, "panels": self.panels,
             "links": [{"type": "dashboards", "tags": ["loom"], "asDropdown": True, "title": "Loom"}]}
        with open(os.path.join(OUT, fname), "w") as f:
            json.dump(d, f, indent=2); f.write("\n")

RI = "$__rate_interval"
# 1. Cluster overview
d = Dash()
d.row("Jobs and nodes")
d.panel("Running jobs", [('sum(loom_jobs{phase="RUNNING"})', "running")], "stat", w=4, h=4)
d.panel("Pending jobs", [('sum(loom_jobs{phase="PENDING"})', "pending")], "stat", w=4, h=4)
d.panel("Failed jobs", [('sum(loom_jobs{phase="FAILED"})', "failed")], "stat", w=4, h=4)
d.panel("Live nodes", [('sum(loom_nodes{state="live"})', "live")], "stat", w=4, h=4)
d.panel("Lost nodes", [('sum(loom_nodes{state="lost"})', "lost")], "stat", w=4, h=4)
d.panel("Slot utilisation", [('sum(loom_rank_slots{state="used"}) / clamp_min(sum(loom_rank_slots), 1)', "used")],
        "stat", unit="percentunit", w=4, h=4)
d.panel("Jobs by phase", [("sum by (phase) (loom_jobs)", "{{phase}}")])
d.panel("Rank slots (live nodes)", [("sum by (state) (loom_rank_slots)", "{{state}}")])
d.row("Scheduler")
d.panel("Phase transitions per minute", [(f"sum by (to) (rate(loom_job_phase_transitions_total[{RI}])) * 60", "to {{to}}")])
d.panel("Scheduling cycle duration", [
    (f"histogram_quantile(0.5, sum by (le) (rate(loom_scheduling_cycle_seconds_bucket[{RI}])))", "p50"),
    (f"histogram_quantile(0.99, sum by (le) (rate(loom_scheduling_cycle_seconds_bucket[{RI}])))", "p99")], unit="s")
d.panel("Submissions per group commit", [
    (f"sum(rate(loom_submission_commit_jobs_sum[{RI}])) / sum(rate(loom_submission_commit_jobs_count[{RI}]))", "jobs per commit"),
    (f"sum(rate(loom_submission_commits_total[{RI}]))", "commits per second")],
    desc="Submitted jobs stored per SQLite transaction (one fsync each): concurrent submissions share a commit.")
d.row("Workers and daemons")
d.panel("Ranks by state", [("sum by (state) (loom_worker_ranks)", "{{state}}")])
d.panel("Heartbeats per second", [(f"sum by (instance, result) (rate(loom_worker_heartbeats_total[{RI}]))", "{{instance}} {{result}}")], unit="reqps")
d.panel("Heartbeat age", [("time() - loom_worker_last_heartbeat_timestamp_seconds", "{{instance}}")], unit="s",
        desc="Seconds since the scheduler last accepted the worker's heartbeat.")
d.panel("Daemons up", [('up{job=~"loom-.*"}', "{{job}} {{instance}}")])
d.panel("Accelerators by kind and state", [("sum by (kind, state) (loom_accelerators)", "{{kind}} {{state}}")],
        desc="Rank slots (one accelerator each) of registered nodes: free, allocated to a rank, cordoned, or on a lost node.")
d.row("REST gateway (loom-gateway)")
GW_NOSTREAM = 'route!~".*:watch|.*/logs"'
# "> 0": every route and code starts at 0 (so a first request counts), and ~200 zero series
# would fill the legend; only those with traffic in the window are drawn.
d.panel("Gateway requests per second by route and status", [(f"sum by (route, code) (rate(loom_gateway_requests_total[{RI}])) > 0", "{{route}} {{code}}")], unit="reqps",
        desc="Routes and statuses with requests in the window (the others are 0 and not drawn).")
d.panel("Gateway error ratio (5xx)", [(f'(sum(rate(loom_gateway_requests_total{{code=~"5.."}}[{RI}])) or vector(0)) / clamp_min(sum(rate(loom_gateway_requests_total[{RI}])), 1e-9)', "5xx")],
        unit="percentunit", desc="Share of requests answered with a server error. 4xx (the client's mistakes) are not errors of the gateway.")
d.panel("Gateway latency (excluding streams)", [
    (f"histogram_quantile(0.5, sum by (le) (rate(loom_gateway_request_duration_seconds_bucket{{{GW_NOSTREAM}}}[{RI}])))", "p50"),
    (f"histogram_quantile(0.99, sum by (le) (rate(loom_gateway_request_duration_seconds_bucket{{{GW_NOSTREAM}}}[{RI}])))", "p99")], unit="s",
        desc=":watch and followed logs are streams whose duration is their length, not latency; they are left out.")
d.panel("Gateway requests by status class (last hour)", [(f'sum by (code) (increase(loom_gateway_requests_total[1h])) > 0', "{{code}}")],
        desc="Requests answered in the last hour by HTTP status: 4xx are refusals (bad input, limits: 400, 404, 408, 413, 429, 431), 5xx failures.")
d.write("cluster-overview.json", "loom-cluster-overview", "Loom / Cluster overview",
        "Jobs by phase, nodes, slots, scheduler and worker health.")

# 2. Job detail (every per-rank series carries job_id, attempt and rank: jobs sharing a worker
# never share a series; a rank's series exist from its first step until its worker forgets it)
d = Dash()
sel = '{job_id=~"$job", instance=~"$instance", rank=~"$rank"}'
LR = "{{job_id}}/{{attempt}} rank {{rank}}"
d.row("Ranks")
d.panel("Ranks of the job", [('loom_worker_rank_info{job_id=~"$job"}', "{{job_id}} attempt {{attempt}} rank {{rank}} on {{instance}}")],
        "table", w=24, h=5, desc="Running (or starting) ranks of the selected job(s): worker instance, attempt and rank. Ended ranks leave this table.")
d.row("Progress")
d.panel("Step", [(f"loom_trainer_step{sel}", LR)])
d.panel("Loss", [(f"loom_trainer_loss{sel}", "train " + LR),
                 (f"loom_trainer_eval_loss{sel}", "held-out " + LR)],
        desc="Nats per token.")
d.panel("Throughput", [(f"max by (job_id, attempt) (rate(loom_trainer_tokens_total{sel}[{RI}]))", "{{job_id}}/{{attempt}}")], unit="short",
        desc="Global training tokens per second of each job attempt (every rank counts the job's tokens; the fastest-reporting rank is shown).")
d.panel("Step time", [(f"loom_trainer_step_seconds{sel}", LR)], unit="s")
d.row("Memory")
d.panel("Model states per rank", [
    (f"loom_trainer_param_bytes{sel}", "parameters " + LR),
    (f"loom_trainer_grad_bytes{sel}", "gradients " + LR),
    (f"loom_trainer_optimizer_state_bytes{sel}", "optimizer state " + LR)], unit="bytes",
        desc="Bytes each rank holds for the whole step. The three add up to the rank's model-state footprint (ZeRO-3 divides all three by the data-parallel size).")
d.panel("Peak memory per step", [
    (f"loom_trainer_memory_peak_bytes{sel}", "total peak " + LR),
    (f"loom_trainer_buffer_peak_bytes{sel}", "buffers " + LR),
    (f"loom_trainer_cached_peak_bytes{sel}", "cached " + LR)], unit="bytes",
        desc="Peak of the rank's total tracked memory in the last step (what must fit), and the peaks of its temporary buffers (gathered parameters, buckets) and pooled idle buffers.")
d.panel("Job model-state memory (all ranks)", [
    (f"sum by (job_id, attempt) (loom_trainer_param_bytes{sel} + loom_trainer_grad_bytes{sel} + loom_trainer_optimizer_state_bytes{sel})", "{{job_id}}/{{attempt}}")],
        unit="bytes", desc="Parameters, gradients and optimizer state summed over the job's ranks: about the unsharded model states (16 bytes per parameter for fp32 Adam), however they are sharded.")
d.panel("ZeRO-3: gathered peak / partition", [(f"loom_trainer_zero_gathered_peak_bytes{sel} / loom_trainer_zero_partition_bytes{sel}", LR)],
        desc="How much of the full model a rank gathers at its peak relative to its own shard (stage3_max_live_parameters and prefetch bound it).")
d.row("Stalls and communication")
d.panel("Stall: time since last step", [(f"time() - loom_trainer_last_step_timestamp_seconds{sel}", LR)],
        unit="s", desc="Running ranks only. Grows while a rank waits (collectives, data, a stuck peer); the LoomNoStepProgress alert fires above 10 minutes.")
d.panel("Step time vs. median of the job (communication and stragglers)", [(f"loom_trainer_step_seconds{sel} / on (job_id, attempt) group_left quantile by (job_id, attempt) (0.5, loom_trainer_step_seconds{sel})", LR)],
        desc="Ranks of one job step in lock-step (ZeRO-3 collectives), so a rank far above 1 is waiting on communication or is a straggler.")
d.panel("Communication and stall time per step", [
    (f"loom_trainer_communication_seconds{sel}", "communication " + LR),
    (f"loom_trainer_stall_seconds{sel}", "stall " + LR),
    (f"loom_trainer_step_seconds{sel}", "step " + LR)], unit="s",
        desc="Of the last step: seconds blocked in collectives (communication), and that plus seconds building input batches (stall). Step minus stall is compute.")
d.panel("Stall share of step time", [(f"loom_trainer_stall_seconds{sel} / clamp_min(loom_trainer_step_seconds{sel}, 1e-9)", LR)],
        unit="percentunit", desc="Fraction of the last step the rank waited instead of computing. A rank with a much lower share than its peers is the straggler the others wait for.")
d.row("ZenFlow (zero_optimization.zenflow)")
d.panel("ZenFlow: wait on the CPU optimizer", [
    (f"loom_trainer_zenflow_stall_seconds{sel}", "stall " + LR),
    (f"loom_trainer_step_seconds{sel} and on (job_id, attempt, rank) loom_trainer_zenflow_stall_seconds{sel}", "step " + LR)], unit="s",
        desc="Seconds of the last step the training thread waited for the CPU optimizer; stall-free offload keeps it near 0.")
d.panel("ZenFlow: selection and update interval", [
    (f"loom_trainer_zenflow_selected_mass_ratio{sel}", "selected gradient mass " + LR),
    (f"loom_trainer_zenflow_update_interval_steps{sel}", "CPU update interval (steps) " + LR)],
        desc="Share of the 2-D gradients' L1 mass in the columns updated on the device each step, and the steps in the last CPU update interval.")
d.panel("ZenFlow: bytes moved per second", [(f"rate(loom_trainer_zenflow_moved_bytes_total{sel}[{RI}])", LR)], unit="Bps",
        desc="Between the device-side partitions and the host buffers.")
d.row("SuperOffload (offload_optimizer.super_offload)")
d.panel("SuperOffload: speculation", [
    (f"rate(loom_trainer_superoffload_speculated_sub_groups_total{sel}[{RI}])", "speculated " + LR),
    (f"rate(loom_trainer_superoffload_speculation_hits_total{sel}[{RI}])", "hits " + LR),
    (f"rate(loom_trainer_superoffload_speculation_paused_sub_groups_total{sel}[{RI}]) + rate(loom_trainer_superoffload_speculation_no_buffer_sub_groups_total{sel}[{RI}])", "not speculated " + LR)],
        unit="ops", desc="Sub-group CPU optimizer steps per second: started speculatively during backward, committed unchanged (hits), and not speculated (the step before clipped, or no NVMe swap buffer free).")
d.panel("SuperOffload: hit ratio and overlap", [
    (f"loom_trainer_superoffload_speculation_hit_ratio{sel}", "hit ratio " + LR),
    (f"loom_trainer_superoffload_optimizer_overlap_ratio{sel}", "optimizer work hidden under backward " + LR)],
        unit="percentunit", desc="Hits / speculated since the rank started; share of the last step's optimizer work done before the end of backward.")
d.panel("SuperOffload: rollbacks and replays per minute", [
    (f"sum by (job_id, attempt, rank, reason) (rate(loom_trainer_superoffload_rollbacks_total{sel}[{RI}])) * 60", "rollback {{reason}} {{job_id}}/{{attempt}} rank {{rank}}"),
    (f"sum by (job_id, attempt, rank, reason) (rate(loom_trainer_superoffload_replays_total{sel}[{RI}])) * 60", "replay {{reason}} {{job_id}}/{{attempt}} rank {{rank}}")],
        desc="Speculative sub-group steps undone (overflow: fp16 non-finite gradients, the step skipped; clip: clipping was active) and replayed with the clip coefficient.")
d.panel("SuperOffload: optimizer work per step", [(f"loom_trainer_superoffload_optimizer_work_seconds{sel}", LR)], unit="s")
d.row("ALST (sequence parallelism, activation offload)")
d.panel("Activation checkpoints offloaded to host", [(f"loom_trainer_activation_offload_peak_bytes{sel}", LR)], unit="bytes",
        desc="Peak bytes of checkpointed layer inputs held in host memory in the last step (activation_checkpointing.cpu_checkpointing); 0 without offload.")
d.panel("Tokens per second per rank", [(f"rate(loom_trainer_tokens_total{sel}[{RI}]) / on (job_id, attempt) group_left count by (job_id, attempt) (loom_trainer_tokens_total{sel})", LR)],
        desc="The job's throughput divided by its ranks: with Ulysses sequence parallelism each rank holds sequence_length / sequence_parallel_size tokens of every sample.")
d.row("Accelerators")
d.panel("Accelerators of the job", [('loom_rank_accelerator_info{job_id=~"$job"}', "{{node}} accelerator {{accelerator_index}} rank {{rank}}")],
        "table", w=24, h=5, desc="Node and accelerator index of each running rank: join with DCGM_FI_* series on gpu (docs/metrics.md).")
d.write("job-detail.json", "loom-job-detail", "Loom / Job detail",
        "Per-rank training progress of jobs: loss, throughput, step time, memory, stalls. Pick a job, optionally narrow to workers and ranks.",
        variables=[("job", "label_values(loom_trainer_step, job_id)", "Job"),
                   ("instance", 'label_values(loom_trainer_step{job_id=~"$job"}, instance)', "Worker"),
                   ("rank", 'label_values(loom_trainer_step{job_id=~"$job"}, rank)', "Rank")])

# 3. Queues and fairness
d = Dash()
d.row("Queue")
d.panel("Pending jobs", [('sum(loom_jobs{phase="PENDING"})', "pending"), ('sum(loom_jobs{phase="ADMITTED"})', "admitted"), ('sum(loom_jobs{phase="STARTING"})', "starting")])
d.panel("Submissions and admissions per minute", [
    (f"sum(rate(loom_jobs_submitted_total[{RI}])) * 60", "submitted"),
    (f'sum(rate(loom_job_phase_transitions_total{{from="PENDING"}}[{RI}])) * 60', "left PENDING"),
    (f'sum(rate(loom_job_phase_transitions_total{{to=~"SUCCEEDED|FAILED|CANCELLED"}}[{RI}])) * 60', "finished")])
d.panel("Queue wait (entering PENDING to placement)", [
    (f"histogram_quantile(0.5, sum by (le) (rate(loom_job_queue_wait_seconds_bucket[{RI}])))", "p50"),
    (f"histogram_quantile(0.9, sum by (le) (rate(loom_job_queue_wait_seconds_bucket[{RI}])))", "p90"),
    (f"histogram_quantile(0.99, sum by (le) (rate(loom_job_queue_wait_seconds_bucket[{RI}])))", "p99")], unit="s",
        desc="From a job's submission, requeue (preemption, drain) or resume to its placement.")
d.panel("Outcomes", [(f'sum by (to) (increase(loom_job_phase_transitions_total{{to=~"SUCCEEDED|FAILED|CANCELLED"}}[1h]))', "{{to}}")],
        desc="Jobs that ended in the last hour, by final phase.")
d.panel("Restarts per hour by cause", [(f"sum by (cause) (increase(loom_job_restarts_total[1h]))", "{{cause}}")],
        desc="New attempts after a failure: user (the job's code), infra (lost node), setup, oom, preemption.")
d.panel("Admission attempts per minute by result", [(f"sum by (result) (rate(loom_admission_attempts_total[{RI}])) * 60", "{{result}}")],
        desc="Each scheduling cycle tries every pending job: admitted, no_capacity (not enough free accelerators now), quota, infeasible (never fits), blocked (behind a higher-priority job), preempting.")
d.row("Tenants and queues")
d.panel("Running jobs by tenant", [('sum by (tenant) (loom_tenant_jobs{phase="RUNNING", tenant=~"$tenant", queue=~"$queue"})', "{{tenant}}")])
d.panel("Pending jobs by tenant and queue", [('sum by (tenant, queue) (loom_tenant_jobs{phase="PENDING", tenant=~"$tenant", queue=~"$queue"})', "{{tenant}} / {{queue}}")])
d.panel("Share of running jobs by tenant", [('sum by (tenant) (loom_tenant_jobs{phase="RUNNING", tenant=~"$tenant"}) / scalar(clamp_min(sum(loom_tenant_jobs{phase="RUNNING"}), 1))', "{{tenant}}")],
        unit="percentunit", desc="Fair share at a glance: each tenant's fraction of running jobs.")
d.panel("Jobs by queue and phase", [('sum by (queue, phase) (loom_tenant_jobs{queue=~"$queue", phase=~"PENDING|ADMITTED|STARTING|RUNNING|RECOVERING"})', "{{queue}} {{phase}}")])
d.row("Capacity")
d.panel("Slot utilisation", [('sum(loom_rank_slots{state="used"}) / clamp_min(sum(loom_rank_slots), 1)', "used")], unit="percentunit")
d.panel("Slots per worker and running ranks", [("loom_worker_slots", "slots {{instance}}"), ('loom_worker_ranks{state="RANK_STATE_RUNNING"}', "running {{instance}}")])
d.panel("Accelerators by kind and state", [("sum by (kind, state) (loom_accelerators)", "{{kind}} {{state}}")])
d.write("queues-fairness.json", "loom-queues-fairness", "Loom / Queues and fairness",
        "Queue depth, admission results and completion rates, restarts by cause, jobs per tenant and queue, accelerator use.",
        variables=[("tenant", "label_values(loom_tenant_jobs, tenant)", "Tenant"),
                   ("queue", "label_values(loom_tenant_jobs, queue)", "Queue")])

# 4. Checkpoints
d = Dash()
d.row("Trainer checkpoints")
d.panel("Checkpoint age", [("time() - loom_trainer_last_checkpoint_timestamp_seconds", "{{job_id}}/{{attempt}} rank {{rank}} on {{instance}}")],
        unit="s", desc="Seconds since each running rank's newest checkpoint (or its start); ended ranks have no series. LoomCheckpointTooOld fires above 2 h.")
d.panel("Steps since last checkpoint", [("loom_trainer_step - loom_trainer_last_checkpoint_step", "{{job_id}}/{{attempt}} rank {{rank}}")],
        desc="Training that a failure now would repeat. A resumed attempt counts from the checkpoint it resumed from.")
d.panel("Last checkpoint step", [("loom_trainer_last_checkpoint_step", "{{job_id}}/{{attempt}} rank {{rank}}")])
d.row("Consolidation (loom-checkpoint)")
d.panel("Consolidations per hour", [(f"sum by (result) (increase(loom_checkpoint_consolidations_total[1h]))", "{{result}}")])
d.panel("Consolidation duration", [
    (f"histogram_quantile(0.5, sum by (le) (rate(loom_checkpoint_consolidation_seconds_bucket[{RI}])))", "p50"),
    (f"histogram_quantile(0.99, sum by (le) (rate(loom_checkpoint_consolidation_seconds_bucket[{RI}])))", "p99"),
    (f"sum(rate(loom_checkpoint_consolidation_seconds_sum[{RI}])) / sum(rate(loom_checkpoint_consolidation_seconds_count[{RI}]))", "mean")], unit="s")
d.panel("Safetensors bytes written", [(f"sum(rate(loom_checkpoint_consolidated_bytes_total[{RI}]))", "bytes/s")], unit="Bps")
d.write("checkpoints.json", "loom-checkpoints", "Loom / Checkpoints",
        "Checkpoint freshness per running rank and the checkpoint service's consolidations.")
