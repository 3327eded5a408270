#!/opt/loom/venv/bin/python3
"""Renders every Loom kustomize overlay offline, validates each object against the Kubernetes API
schema, then checks what Loom's manifests and overlays claim.

Usage: validate.py [--kubectl PATH] K8S_DIR
  K8S_DIR  deploy/k8s (holds base/ and overlays/<name>/)

For each overlay: `kubectl kustomize K8S_DIR/overlays/<name>` (no cluster needed), then
  1. every object against the Kubernetes KUBERNETES_VERSION API's own OpenAPI schema, strictly
     (kubernetes-validate, which bundles the schemas: nothing is fetched). This is what types,
     required fields, apiVersion/kind and field names are checked by: an unknown or misspelled
     field, a string where an integer belongs, a missing `containers` fail here, naming the object
     and the field. Only an overlay whose objects all pass goes on to step 2, which assumes
     well-formed objects.
  2. what the schema cannot know (it types a quantity as "string or number", a name as a string,
     a port as an integer, and sees one object at a time):
  * every object: DNS-1123 metadata.name, namespace on namespaced kinds,
    one namespace for the whole overlay, the Namespace object itself present;
  * workloads (StatefulSet, Deployment, DaemonSet): selector matches the pod template labels,
    part-of=loom label, container image pinned (registry/name:tag, not :latest), command,
    named container ports in 1-65535, readiness and liveness probes on a declared port, CPU and
    memory requests with valid quantities, every volumeMount backed by a volume, every PVC claim
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

import kubernetes_validate.utils as kubernetes_validate
import yaml

# The Kubernetes API the manifests are checked against. The docs name no minimum cluster
# version, so this is the version of the kubectl that renders the overlays here and that
# docs/operations.md applies them with: scripts/install_deps.sh's `kubectl` package, client
# v1.32.4 (`kubectl version --client`); kubectl supports API servers one minor version either
# side of it. kubernetes-validate 1.37.0 bundles the schemas of 1.25 to 1.37 (`-local-strict`
# included); the overlays pass every one of them today, so this pins what is checked, not the
# oldest cluster that works.
KUBERNETES_VERSION = "1.32.0"
# Kinds without a namespace; every other kind the overlays render must carry one.
CLUSTER_SCOPED = {"Namespace"}
WORKLOADS = ("StatefulSet", "Deployment", "DaemonSet")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The schema types a quantity as "string or number"; its syntax is checked here.
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
  # A YAML number is a quantity too (`cpu: 0.5`), as the API server reads it.
  return (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0) or \
      (isinstance(v, str) and QUANTITY.match(v) is not None)


def field_path(obj, path):
  """The schema error's path as a field path, list items by their name where they have one:
  spec.template.spec.containers[gateway].ports[0].containerPort."""
  out = ""
  for key in path:
    if isinstance(key, int):
      item = obj[key] if isinstance(obj, list) and key < len(obj) else None
      name = item.get("name") if isinstance(item, dict) else None
      out += "[%s]" % (name if isinstance(name, str) else key)
      obj = item
    else:
      out += ("." if out else "") + str(key)
      obj = obj.get(key) if isinstance(obj, dict) else None
  return out or "(top level)"


def check_schema(c, objs):
  """Each object against the Kubernetes KUBERNETES_VERSION schema, strict: unknown fields fail.
  kubernetes-validate reports the first error of each object. Returns whether all passed."""
  ok = True
  for o in objs:
    where = "%s/%s" % (o.get("kind"), o.get("metadata", {}).get("name"))
    try:
      got = kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
      # It falls back to the newest bundled version not newer than the one asked for.
      ok &= c.expect(got == kubernetes_validate.major_minor(KUBERNETES_VERSION),
                     "%s: validated against Kubernetes %s, not %s" %
                     (where, got, KUBERNETES_VERSION))
    except kubernetes_validate.ValidationError as e:
      ok = c.expect(False, "%s: %s: %s (Kubernetes %s schema)" %
                    (where, field_path(o, e.path), e.message, e.version))
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.VersionNotSupportedError,
            kubernetes_validate.InvalidSchemaError) as e:
      ok = c.expect(False, "%s: %s" % (where, e.message))
  return ok


def probe_port(probe):
  for kind in ("httpGet", "tcpSocket", "grpc"):
    if kind in probe:
      return probe[kind].get("port")
  return None


def check_objects(c, objs):
  namespaces = set()
  by_kind = {}
  for o in objs:
    kind = o.get("kind")
    md = o.get("metadata", {})
    name = md.get("name", "")
    where = "%s/%s" % (kind, name)
    by_kind.setdefault(kind, []).append(o)
    c.expect(DNS1123.match(name) and len(name) <= 63, "%s: bad metadata.name" % where)
    if kind not in CLUSTER_SCOPED:
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
      # The schema has made containerPort an integer; its range and the name are checked here.
      c.expect(p.get("name") and 0 < p["containerPort"] < 65536, "%s: bad port %s" % (cw, p))
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
    if check_schema(c, objs):
      ns, by_kind = check_objects(c, objs)
      check_overlay_claims(c, name, ns, by_kind)
      check_peer_addresses(c, by_kind)
    else:
      c.problems.append("%s: Loom's own checks skipped until every object passes the schema" % name)
    print("%s: %d objects (Kubernetes %s schema, strict), %d problems" %
          (name, len(objs), kubernetes_validate.major_minor(KUBERNETES_VERSION), len(c.problems)))
    problems += c.problems
  for p in problems:
    print(p)
  if len(overlays) < 3:
    problems.append("expected the cpu-dev, gpu-h100-h200 and gh200 overlays, found %s" % overlays)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
