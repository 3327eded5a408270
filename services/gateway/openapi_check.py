#!/usr/bin/env python3
"""Checks services/gateway/openapi.json, the document loom-gateway embeds and serves.

  openapi_check.py DOC              exit 0 if DOC passes, else 1 with one line per problem
  openapi_check.py --self_test DOC  each broken copy of DOC (a 500 response dropped, an invalid
                                    schema type, ...) must fail, naming its operation

Three layers, each problem on one line that names the operation ("GetJob (GET /v1/jobs/{id}): ..."):
  * every local $ref resolves (first: openapi-spec-validator stops at the first dangling one);
  * openapi-spec-validator (PyPI, scripts/python-requirements.txt): the document against the
    OpenAPI 3.0 schema, schemas against the schema dialect, path parameters declared,
    operationIds unique;
  * the project's rules: every operation declares a 2xx, a 4xx and a 500 response (the gateway's
    INTERNAL), has an operationId (unique, URL-safe) and a summary, declares each parameter once
    and exactly the path's template parameters (required), names only defined security schemes;
    no two paths identical up to parameter names, no trailing slash or query string in a path;
    a licence with a URL; servers without trailing slashes; enum values of the declared type;
    every component used.
"""

import copy
import json
import re
import sys

from openapi_spec_validator import OpenAPIV30SpecValidator, OpenAPIV31SpecValidator

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
TEMPLATE_PARAM = re.compile(r"\{([^{}]+)\}")
URL_SAFE = re.compile(r"^[A-Za-z0-9_.~-]+$")
JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}


def operations(doc):
    """(path, method, operation, path item) for each operation."""
    for path, item in (doc.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        for method in METHODS:
            op = item.get(method)
            if isinstance(op, dict):
                yield path, method, op, item


def op_name(path, method, op):
    return "%s (%s %s)" % (op.get("operationId", "<no operationId>"), method.upper(), path)


def where(doc, location):
    """Names the operation a location (a sequence of keys) lies in, else its JSON pointer."""
    parts = [str(p) for p in location]
    if len(parts) >= 3 and parts[0] == "paths" and parts[2] in METHODS:
        op = ((doc.get("paths") or {}).get(parts[1]) or {}).get(parts[2])
        if isinstance(op, dict):
            rest = "/".join(parts[3:])
            return op_name(parts[1], parts[2], op) + (" at " + rest if rest else "")
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def resolve_pointer(doc, ref):
    if not ref.startswith("#/"):
        return None, "only local references (#/...) are allowed"
    node = doc
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None, "does not resolve"
    return node, None


def walk(node, location=()):
    """(location, dict) for every object in the document."""
    if isinstance(node, dict):
        yield location, node
        for key, value in node.items():
            yield from walk(value, location + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, location + (i,))


def check_refs(doc):
    problems = []
    for location, obj in walk(doc):
        ref = obj.get("$ref")
        if isinstance(ref, str):
            _, error = resolve_pointer(doc, ref)
            if error:
                problems.append("%s: $ref %s %s" % (where(doc, location), ref, error))
    return problems


def component_users(doc):
    """("components", kind, name) -> operationIds that reach it through $refs."""
    direct = {}  # referrer (an operationId or a component) -> components it names
    for location, obj in walk(doc):
        ref = obj.get("$ref")
        if not (isinstance(ref, str) and ref.startswith("#/components/")):
            continue
        target = tuple(ref[2:].split("/")[:3])
        if location[:1] == ("components",) and len(location) >= 3:
            referrer = tuple(location[:3])
        elif location[:1] == ("paths",) and len(location) >= 3 and location[2] in METHODS:
            referrer = doc["paths"][location[1]][location[2]].get("operationId", location[1])
        else:
            continue
        direct.setdefault(referrer, set()).add(target)
    users = {}
    for referrer in [r for r in direct if isinstance(r, str)]:
        seen, frontier = set(), list(direct[referrer])
        while frontier:
            target = frontier.pop()
            if target not in seen:
                seen.add(target)
                frontier.extend(direct.get(target, ()))
        for target in seen:
            users.setdefault(target, []).append(referrer)
    return {k: sorted(v) for k, v in users.items()}


def check_with_validator(doc):
    version = str(doc.get("openapi", ""))
    if version.startswith("3.0."):
        validator = OpenAPIV30SpecValidator(doc)
    elif version.startswith("3.1."):
        validator = OpenAPIV31SpecValidator(doc)
    else:
        return ["#/openapi: %r is not an OpenAPI 3.0 or 3.1 version" % version]
    problems = []
    try:
        for error in validator.iter_errors():
            location = list(getattr(error, "absolute_path", None) or [])
            message = str(error).split("\n")[0]
            if len(message) > 300:
                message = message[:300] + "..."
            users = ""
            if location[:1] == ["components"] and len(location) >= 3:
                ops = component_users(doc).get(tuple(str(p) for p in location[:3]), [])
                users = " (used by %s)" % ", ".join(ops) if ops else ""
            problems.append("%s%s: %s" % (where(doc, location), users, message))
    except Exception as e:  # the validator gives up on some documents; that is a failure too
        problems.append("openapi-spec-validator failed: %s: %s" % (type(e).__name__, e))
    return problems


def check_schema_enums(doc, problems):
    for location, obj in walk(doc):
        enum, kind = obj.get("enum"), obj.get("type")
        if isinstance(enum, list) and kind in JSON_TYPES:
            for value in enum:
                bad = not isinstance(value, JSON_TYPES[kind]) or (
                    kind in ("integer", "number") and isinstance(value, bool))
                if bad and not (value is None and obj.get("nullable")):
                    problems.append("%s: enum value %r is not of type %s" %
                                    (where(doc, location), value, kind))


def check_rules(doc):
    problems = []
    schemes = set(((doc.get("components") or {}).get("securitySchemes") or {}).keys())
    for requirement in doc.get("security") or []:
        for scheme in requirement:
            if scheme not in schemes:
                problems.append("#/security: security scheme %r is not defined" % scheme)

    info = doc.get("info") or {}
    if not (info.get("license") or {}).get("url"):
        problems.append("#/info/license: a licence with a url is required")
    servers = doc.get("servers") or []
    if not servers:
        problems.append("#/servers: at least one server is required")
    for i, server in enumerate(servers):
        url = server.get("url", "")
        if url.endswith("/") or "example.com" in url:
            problems.append("#/servers/%d: url %r ends with '/' or names example.com" % (i, url))

    seen_ids = {}
    seen_shapes = {}
    for path in (doc.get("paths") or {}):
        if "?" in path or "#" in path:
            problems.append("%s: a path must not include a query string or fragment" % path)
        if path != "/" and path.endswith("/"):
            problems.append("%s: a path must not end with '/'" % path)
        shape = TEMPLATE_PARAM.sub("{}", path)
        if shape in seen_shapes:
            problems.append("%s: identical to %s up to parameter names" % (path, seen_shapes[shape]))
        seen_shapes.setdefault(shape, path)

    for path, method, op, item in operations(doc):
        name = op_name(path, method, op)
        op_id = op.get("operationId")
        if not op_id:
            problems.append("%s: no operationId" % name)
        else:
            if not URL_SAFE.match(op_id):
                problems.append("%s: operationId %r is not URL-safe" % (name, op_id))
            if op_id in seen_ids:
                problems.append("%s: operationId %r is also used by %s" % (name, op_id,
                                                                         seen_ids[op_id]))
            seen_ids.setdefault(op_id, "%s %s" % (method.upper(), path))
        if not op.get("summary"):
            problems.append("%s: no summary" % name)

        codes = [str(c) for c in (op.get("responses") or {})]
        if not any(c.startswith("2") for c in codes):
            problems.append("%s: no 2xx response" % name)
        if not any(c.startswith("4") for c in codes):
            problems.append("%s: no 4xx response (every operation says how a request fails)" % name)
        if "500" not in codes:
            problems.append("%s: no 500 response (the gateway's INTERNAL error)" % name)

        # Parameters: the operation's override the path item's by (name, in).
        params = {}
        for source in (item.get("parameters") or [], op.get("parameters") or []):
            own = set()
            for p in source:
                if "$ref" in p:
                    p, _ = resolve_pointer(doc, p["$ref"])
                    if not isinstance(p, dict):
                        continue  # reported by check_refs
                key = (p.get("name"), p.get("in"))
                if key in own:
                    problems.append("%s: parameter %s (in %s) declared twice" % (name, key[0],
                                                                               key[1]))
                own.add(key)
                params[key] = p
        template = TEMPLATE_PARAM.findall(path)
        declared = {n: p for (n, where_), p in params.items() if where_ == "path"}
        for param in template:
            if param not in declared:
                problems.append("%s: path parameter {%s} is not declared" % (name, param))
        for param, p in declared.items():
            if param not in template:
                problems.append("%s: path parameter %r is not in the path" % (name, param))
            elif p.get("required") is not True:
                problems.append("%s: path parameter %r must be required" % (name, param))

        for requirement in op.get("security") or []:
            for scheme in requirement:
                if scheme not in schemes:
                    problems.append("%s: security scheme %r is not defined" % (name, scheme))

    check_schema_enums(doc, problems)

    # Every component is used: a reference from outside components, or from a used component.
    used = set()
    refs_from = {}
    for location, obj in walk(doc):
        ref = obj.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            target = tuple(ref[2:].split("/")[:3])
            if location[:1] == ("components",) and len(location) >= 3:
                refs_from.setdefault(tuple(location[:3]), set()).add(target)
            else:
                used.add(target)
    frontier = list(used)
    while frontier:
        for target in refs_from.get(frontier.pop(), ()):
            if target not in used:
                used.add(target)
                frontier.append(target)
    for kind in ("schemas", "responses", "parameters", "requestBodies", "headers", "examples"):
        for component in ((doc.get("components") or {}).get(kind) or {}):
            if ("components", kind, component) not in used:
                problems.append("#/components/%s/%s: never referenced" % (kind, component))
    return problems


def check(doc):
    problems = check_refs(doc)
    if not problems:  # the validator stops with an exception at a dangling $ref
        problems += check_with_validator(doc)
    return problems + check_rules(doc)


def self_test(doc):
    """Each mutation of a copy must fail with a problem naming `expect`."""
    def drop_500(d):
        del d["paths"]["/v1/jobs/{id}"]["get"]["responses"]["500"]

    def drop_4xx(d):
        responses = d["paths"]["/v1/queues"]["get"]["responses"]
        for code in [c for c in responses if c.startswith("4")]:
            del responses[code]

    def bad_type(d):
        d["paths"]["/v1/jobs/{id}:kill"]["post"]["parameters"][0]["schema"]["type"] = "strin"

    def bad_ref(d):
        d["paths"]["/v1/jobs/{id}:cancel"]["post"]["responses"]["404"] = {
            "$ref": "#/components/responses/NoSuchResponse"}

    def duplicate_id(d):
        d["paths"]["/v1/jobs/{id}:explain"]["get"]["operationId"] = "GetJob"

    def undeclared_param(d):
        d["paths"]["/v1/jobs/{id}/logs"]["get"]["parameters"] = [
            p for p in d["paths"]["/v1/jobs/{id}/logs"]["get"]["parameters"] if p["in"] != "path"]

    def bad_enum(d):
        d["paths"]["/v1/jobs"]["get"]["parameters"].append(
            {"name": "limit", "in": "query", "schema": {"type": "integer", "enum": ["ten"]}})

    def bad_component_type(d):
        d["components"]["schemas"]["QueueInfo"]["properties"]["name"] = {"type": "text"}

    def no_2xx(d):
        del d["paths"]["/v1/nodes"]["get"]["responses"]["200"]

    cases = [
        ("a 500 response dropped", drop_500, "GetJob (GET /v1/jobs/{id}): no 500 response"),
        ("every 4xx response dropped", drop_4xx, "ListQueues (GET /v1/queues): no 4xx response"),
        ("an invalid schema type", bad_type, "KillJob (POST /v1/jobs/{id}:kill) at parameters"),
        ("a dangling $ref", bad_ref, "CancelJob (POST /v1/jobs/{id}:cancel) at responses/404: $ref"),
        ("a duplicate operationId", duplicate_id, "operationId 'GetJob' is also used"),
        ("an undeclared path parameter", undeclared_param,
         "StreamLogs (GET /v1/jobs/{id}/logs): path parameter {id} is not declared"),
        ("an enum value of another type", bad_enum, "ListJobs (GET /v1/jobs) at parameters"),
        ("an invalid type in a component schema", bad_component_type,
         "#/components/schemas/QueueInfo (used by ListQueues)"),
        ("no 2xx response", no_2xx, "ListNodes (GET /v1/nodes): no 2xx response"),
    ]
    failed = 0
    for title, mutate, expect in cases:
        broken = copy.deepcopy(doc)
        mutate(broken)
        problems = check(broken)
        if any(expect in p for p in problems):
            print("self-test ok: %s -> %s" % (title, next(p for p in problems if expect in p)))
        else:
            failed += 1
            print("self-test FAILED: %s: no problem containing %r; got:\n  %s" %
                  (title, expect, "\n  ".join(problems) or "(none)"))
    return failed


def main(argv):
    if len(argv) == 3 and argv[1] == "--self_test":
        with open(argv[2]) as f:
            doc = json.load(f)
        if check(doc):
            print("openapi_check: the unmodified %s must pass first" % argv[2])
            return 1
        return 1 if self_test(doc) else 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print("openapi_check: %s: %s" % (argv[1], e))
        return 1
    problems = check(doc)
    for p in problems:
        print(p)
    if problems:
        print("openapi_check: %d problem(s) in %s" % (len(problems), argv[1]))
        return 1
    print("openapi_check: %s is valid (%d operations)" % (argv[1], sum(1 for _ in operations(doc))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
