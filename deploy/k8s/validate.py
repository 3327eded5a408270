#!/usr/bin/python3
"""Renders every Loom kustomize overlay offline and validates the objects structurally.

Usage: validate.py [--kubectl PATH] K8S_DIR
  K8S_DIR  deploy/k8s (holds base/ and overlays/<name>/)

For each overlay: `kubectl kustomize K8S_DIR/overlays/<name>` (no cluster needed), then checks
  * every object: known apiVersion/kind, DNS-1123 metadata.name, namespace on namespaced kinds,
    one namespace for the whole overlay, the Namespace object itself present;
  * workloads (StatefulSet, Deployment, DaemonSet): selector matches the pod template labels,
    part-of=loom label, container image pinned (registry/name:tag, not :latest), command,
    named container ports, readiness and liveness probes on a declared port, CPU and memory
    requests with valid quantities, every volumeMount backed by a volume, every PVC claim
    rendered (or a volumeClaimTemplate), prometheus.io scrape annotations on the metrics port;
  * Services: selector matches a workload and every targetPort names a port of it;
  * what each overlay claims (cpu-dev: loom-dev namespace, no GPUs, 2 CPU slots;
    gpu-h100-h200: one DaemonSet per kind, 8 GPUs = 8 slots, affinity on its product label,
    amd64, control plane off GPU nodes; gh200: arm64 everywhere, 1 GPU = 1 slot).
Exits 1 listing every problem, 0 otherwise.
"""
import argparse
import os
import re
import subprocess
import sys

import yaml

KNOWN = {
    ("v1", "Namespace"): False,
    ("v1", "Service"): True,
    ("v1", "PersistentVolumeClaim"): True,
    ("v1", "ConfigMap"): True,
    ("v1", "Secret"): True,
    ("apps/v1", "StatefulSet"): True,
    ("apps/v1", "Deployment"): True,
    ("apps/v1", "DaemonSet"): True,
}
WORKLOADS = ("StatefulSet", "Deployment", "DaemonSet")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
IMAGE = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+:[A-Za-z0-9._-]+$")


class Checker:

  def __init__(self, overlay):
    self.overlay = overlay
    self.problems = []

  def expect(self, cond, msg):
    if not cond:
      self.problems.append("%s: %s" % (self.overlay, msg))
    return cond


def render(kubectl, path):
  out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
  if out.returncode != 0:
    raise RuntimeError("kubectl kustomize %s failed: %s" % (path, out.stderr.strip()))
  return [d for d in yaml.safe_load_all(out.stdout) if d]


def quantity_ok(v):
  return isinstance(v, int) or (isinstance(v, str) and QUANTITY.match(v) is not None)


def probe_port(probe):
  for kind in ("httpGet", "tcpSocket", "grpc"):
    if kind in probe:
      return probe[kind].get("port")
  return None


def check_objects(c, objs):
  namespaces = set()
  by_kind = {}
  for o in objs:
    api, kind = o.get("apiVersion"), o.get("kind")
    md = o.get("metadata", {})
    name = md.get("name", "")
    where = "%s/%s" % (kind, name)
    by_kind.setdefault(kind, []).append(o)
    if not c.expect((api, kind) in KNOWN, "%s: unknown apiVersion/kind %s %s" % (where, api, kind)):
      continue
    c.expect(DNS1123.match(name) and len(name) <= 63, "%s: bad metadata.name" % where)
    if KNOWN[(api, kind)]:
      if c.expect(md.get("namespace"), "%s: no namespace" % where):
        namespaces.add(md["namespace"])
    c.expect(md.get("labels", {}).get("app.kubernetes.io/part-of") == "loom",
             "%s: no app.kubernetes.io/part-of=loom label" % where)
  c.expect(len(namespaces) == 1, "objects span namespaces %s" % sorted(namespaces))
  ns_objs = [o["metadata"]["name"] for o in by_kind.get("Namespace", [])]
  c.expect(ns_objs == sorted(namespaces), "Namespace objects %s != used %s" % (ns_objs, sorted(namespaces)))
  pvcs = {o["metadata"]["name"] for o in by_kind.get("PersistentVolumeClaim", [])}
  for pvc in by_kind.get("PersistentVolumeClaim", []):
    spec = pvc.get("spec", {})
    c.expect(spec.get("accessModes"), "PVC %s: no accessModes" % pvc["metadata"]["name"])
    c.expect(quantity_ok(spec.get("resources", {}).get("requests", {}).get("storage")),
             "PVC %s: bad storage request" % pvc["metadata"]["name"])
  workloads = [o for k in WORKLOADS for o in by_kind.get(k, [])]
  for w in workloads:
    check_workload(c, w, pvcs)
  for svc in by_kind.get("Service", []):
    check_service(c, svc, workloads)
  return namespaces.pop() if len(namespaces) == 1 else None, by_kind


def check_workload(c, w, pvcs):
  where = "%s/%s" % (w["kind"], w["metadata"]["name"])
  spec = w.get("spec", {})
  tmpl = spec.get("template", {})
  labels = tmpl.get("metadata", {}).get("labels", {})
  sel = spec.get("selector", {}).get("matchLabels", {})
  c.expect(sel and all(labels.get(k) == v for k, v in sel.items()),
           "%s: selector %s does not match template labels %s" % (where, sel, labels))
  c.expect(labels.get("app.kubernetes.io/part-of") == "loom", "%s: pod not part-of loom" % where)
  pod = tmpl.get("spec", {})
  volumes = {v["name"]: v for v in pod.get("volumes", [])}
  claim_templates = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
  for v in volumes.values():
    if "persistentVolumeClaim" in v:
      claim = v["persistentVolumeClaim"]["claimName"]
      c.expect(claim in pvcs, "%s: volume %s claims %s, which is not rendered" % (where, v["name"], claim))
  containers = pod.get("containers", [])
  c.expect(containers, "%s: no containers" % where)
  annotations = tmpl.get("metadata", {}).get("annotations", {})
  metrics_ports = []
  for ct in containers:
    cw = "%s container %s" % (where, ct.get("name"))
    c.expect(IMAGE.match(ct.get("image", "")) and not ct["image"].endswith(":latest"),
             "%s: image %r is not registry/name:tag" % (cw, ct.get("image")))
    c.expect(ct.get("command"), "%s: no command" % cw)
    ports = {}
    for p in ct.get("ports", []):
      c.expect(p.get("name") and isinstance(p.get("containerPort"), int) and
               0 < p["containerPort"] < 65536, "%s: bad port %s" % (cw, p))
      ports[p.get("name")] = p.get("containerPort")
    if "metrics" in ports:
      metrics_ports.append(ports["metrics"])
    for probe in ("readinessProbe", "livenessProbe"):
      port = probe_port(ct.get(probe, {}))
      c.expect(port in ports or port in ports.values(),
               "%s: %s port %r is not a declared container port" % (cw, probe, port))
    req = ct.get("resources", {}).get("requests", {})
    for r in ("cpu", "memory"):
      c.expect(quantity_ok(req.get(r)), "%s: bad or missing %s request %r" % (cw, r, req.get(r)))
    for r, v in list(req.items()) + list(ct.get("resources", {}).get("limits", {}).items()):
      c.expect(quantity_ok(v), "%s: resource %s=%r is not a quantity" % (cw, r, v))
    for m in ct.get("volumeMounts", []):
      c.expect(m["name"] in volumes or m["name"] in claim_templates,
               "%s: volumeMount %s has no volume" % (cw, m["name"]))
  c.expect(annotations.get("prometheus.io/scrape") == "true", "%s: not annotated for scraping" % where)
  c.expect(str(annotations.get("prometheus.io/port")) in [str(p) for p in metrics_ports],
           "%s: prometheus.io/port %r is not its metrics port %s" %
           (where, annotations.get("prometheus.io/port"), metrics_ports))


def check_service(c, svc, workloads):
  where = "Service/%s" % svc["metadata"]["name"]
  sel = svc.get("spec", {}).get("selector", {})
  matches = [w for w in workloads
             if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
  if not c.expect(sel and matches, "%s: selector %s matches no workload" % (where, sel)):
    return
  names = {p.get("name") for w in matches for ct in w["spec"]["template"]["spec"]["containers"]
           for p in ct.get("ports", [])}
  for p in svc["spec"].get("ports", []):
    c.expect(p.get("targetPort") in names, "%s: targetPort %r not a pod port" % (where, p.get("targetPort")))


def worker_args(ds):
  args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
  return dict(a[2:].split("=", 1) for a in args)


def gpus(ds, which):
  res = ds["spec"]["template"]["spec"]["containers"][0]["resources"]
  return res.get(which, {}).get("nvidia.com/gpu")


def affinity_values(pod, key):
  terms = (pod.get("affinity", {}).get("nodeAffinity", {})
           .get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []))
  return [(e["operator"], e.get("values", [])) for t in terms for e in t.get("matchExpressions", [])
          if e["key"] == key]


def check_overlay_claims(c, name, ns, by_kind):
  workers = by_kind.get("DaemonSet", [])
  control = by_kind.get("StatefulSet", []) + by_kind.get("Deployment", [])
  names = sorted(o["metadata"]["name"] for o in control)
  c.expect(names == ["loom-checkpoint", "loom-gateway", "loom-scheduler"],
           "control plane workloads %s" % names)
  sts = by_kind.get("StatefulSet", [])
  c.expect(sts and sts[0]["spec"].get("volumeClaimTemplates"), "scheduler has no PVC template for SQLite")
  if name == "cpu-dev":
    c.expect(ns == "loom-dev", "namespace %s != loom-dev" % ns)
    c.expect(len(workers) == 1, "want one worker DaemonSet")
    for w in workers:
      a = worker_args(w)
      c.expect(a.get("accelerator") == "cpu" and a.get("slots") == "2", "worker args %s" % a)
      c.expect(gpus(w, "requests") is None and gpus(w, "limits") is None, "cpu-dev requests GPUs")
  elif name == "gpu-h100-h200":
    kinds = {}
    for w in workers:
      a = worker_args(w)
      kinds[a.get("accelerator")] = w
      pod = w["spec"]["template"]["spec"]
      c.expect(gpus(w, "requests") == gpus(w, "limits") == int(a.get("slots", 0)) == 8,
               "%s: GPUs %s/%s vs slots %s" % (w["metadata"]["name"], gpus(w, "requests"),
                                               gpus(w, "limits"), a.get("slots")))
      products = [v for op, vals in affinity_values(pod, "nvidia.com/gpu.product") if op == "In" for v in vals]
      want = "H100" if a.get("accelerator") == "h100" else "H200"
      c.expect(products and all(want in p for p in products),
               "%s: product affinity %s is not all %s" % (w["metadata"]["name"], products, want))
      c.expect(("In", ["amd64"]) in affinity_values(pod, "kubernetes.io/arch"), "%s: not amd64" % w["metadata"]["name"])
      c.expect(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
               "%s: no nvidia.com/gpu toleration" % w["metadata"]["name"])
      c.expect(w["spec"]["selector"]["matchLabels"].get("loom.dev/accelerator") == a.get("accelerator"),
               "%s: selector not specific to its accelerator" % w["metadata"]["name"])
    c.expect(sorted(kinds) == ["h100", "h200"], "worker accelerators %s" % sorted(kinds))
    for o in control:
      c.expect(("NotIn", ["true"]) in affinity_values(o["spec"]["template"]["spec"], "nvidia.com/gpu.present"),
               "%s %s may land on GPU nodes" % (o["kind"], o["metadata"]["name"]))
  elif name == "gh200":
    c.expect(len(workers) == 1, "want one worker DaemonSet")
    for w in workers:
      a = worker_args(w)
      pod = w["spec"]["template"]["spec"]
      c.expect(a.get("accelerator") == "gh200", "worker accelerator %s" % a.get("accelerator"))
      c.expect(gpus(w, "requests") == gpus(w, "limits") == int(a.get("slots", 0)) == 1, "GPUs vs slots")
      products = [v for op, vals in affinity_values(pod, "nvidia.com/gpu.product") for v in vals]
      c.expect(products and all("GH200" in p for p in products), "product affinity %s" % products)
    for o in workers + control:
      c.expect(o["spec"]["template"]["spec"].get("nodeSelector", {}).get("kubernetes.io/arch") == "arm64",
               "%s %s is not pinned to arm64" % (o["kind"], o["metadata"]["name"]))
  elif name == "cpu-dev-auth":
    # cpu-dev plus bearer-token authentication from a generated Secret mounted in every daemon
    # that checks or sends tokens.
    c.expect(ns == "loom-dev", "namespace %s != loom-dev" % ns)
    secrets = [o["metadata"]["name"] for o in by_kind.get("Secret", [])]
    auth = [n for n in secrets if n.startswith("loom-auth-")]
    c.expect(len(auth) == 1, "want one generated loom-auth-<hash> Secret, got %s" % secrets)
    want = {"loom-scheduler": ["--auth_tokens_file=/etc/loom/auth/tokens.yaml",
                               "--worker_token_file=/etc/loom/auth/worker.token"],
            "loom-gateway": ["--auth_tokens_file=/etc/loom/auth/tokens.yaml"],
            "loom-worker": ["--token_file=/etc/loom/auth/worker.token"]}
    for o in control + workers:
      flags = want.get(o["metadata"]["name"])
      if flags is None:
        continue
      pod = o["spec"]["template"]["spec"]
      args = pod["containers"][0].get("args", [])
      for f in flags:
        c.expect(f in args, "%s: missing %s" % (o["metadata"]["name"], f))
      vols = {v["name"]: v for v in pod.get("volumes", [])}
      c.expect("auth" in vols and vols["auth"].get("secret", {}).get("secretName") in auth,
               "%s: auth volume does not mount the generated Secret" % o["metadata"]["name"])
      mounts = [m.get("mountPath") for m in pod["containers"][0].get("volumeMounts", [])]
      c.expect("/etc/loom/auth" in mounts, "%s: /etc/loom/auth not mounted" % o["metadata"]["name"])
  else:
    c.expect(False, "unknown overlay (add its claims to validate.py)")


def check_peer_addresses(c, by_kind):
  """The gateway and the scheduler are given loom-checkpoint's Service address (without it the
  gateway's checkpoint routes answer 501 and the scheduler finds no resume points)."""
  svcs = {o["metadata"]["name"]: o for o in by_kind.get("Service", [])}
  ckpt = svcs.get("loom-checkpoint")
  if not c.expect(ckpt is not None, "no loom-checkpoint Service"):
    return
  ports = [p["port"] for p in ckpt["spec"].get("ports", []) if p.get("name") == "grpc"]
  want = "loom-checkpoint:%s" % (ports[0] if ports else "?")
  control = by_kind.get("StatefulSet", []) + by_kind.get("Deployment", [])
  for name, flag in (("loom-gateway", "checkpoint"), ("loom-scheduler", "checkpoint_service")):
    for o in control:
      if o["metadata"]["name"] != name:
        continue
      args = o["spec"]["template"]["spec"]["containers"][0].get("args", [])
      got = [a.split("=", 1)[1] for a in args if a.startswith("--%s=" % flag)]
      c.expect(got == [want], "%s: --%s=%s, want %s" % (name, flag, got[-1] if got else "(absent)",
                                                         want))


def main(argv):
  ap = argparse.ArgumentParser()
  ap.add_argument("--kubectl", default="/usr/bin/kubectl")
  ap.add_argument("k8s_dir")
  args = ap.parse_args(argv)
  overlays = sorted(os.listdir(os.path.join(args.k8s_dir, "overlays")))
  problems = []
  for name in overlays:
    c = Checker(name)
    try:
      objs = render(args.kubectl, os.path.join(args.k8s_dir, "overlays", name))
    except RuntimeError as e:
      problems.append("%s: %s" % (name, e))
      print(problems[-1])
      continue
    ns, by_kind = check_objects(c, objs)
    check_overlay_claims(c, name, ns, by_kind)
    check_peer_addresses(c, by_kind)
    print("%s: %d objects, %d problems" % (name, len(objs), len(c.problems)))
    problems += c.problems
  for p in problems:
    print(p)
  if len(overlays) < 3:
    problems.append("expected the cpu-dev, gpu-h100-h200 and gh200 overlays, found %s" % overlays)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
