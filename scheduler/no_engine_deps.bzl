"""no_engine_deps_test: fails if any target of the calling package reaches //worker/engine."""

def no_engine_deps_test(name):
    """A genquery of deps() of every cc_* target defined above the call, and an sh_test on it.

    Call it last in the BUILD file: native.existing_rules() sees only the rules defined before.

    Args:
      name: the sh_test's name (the genquery is name + "_deps").
    """
    targets = sorted([
        r["name"]
        for r in native.existing_rules().values()
        if r["kind"] in ("cc_library", "cc_test", "cc_binary")
    ])
    pkg = native.package_name()
    native.genquery(
        name = name + "_deps",
        testonly = 1,
        expression = "deps(" + " + ".join(["//%s:%s" % (pkg, t) for t in targets]) + ")",
        scope = [":" + t for t in targets],
    )
    native.sh_test(
        name = name,
        size = "small",
        srcs = ["//scripts:forbidden_deps_test.sh"],
        args = [
            "$(location :%s_deps)" % name,
            "^//worker/engine([/:]|$$)",
            "//%s:%s" % (pkg, targets[0]),
            "no //worker/engine label in deps(//%s)" % pkg,
        ],
        data = [":%s_deps" % name],
    )
