"""A plan directory cannot make the package read files outside it.

    python plan_dir_check.py PLAN_DIR WORK_DIR

Copies the plan directory PLAN_DIR (written by qsyncc) into WORK_DIR,
rewrites the manifest's file names of its first device — absolute paths,
`..` components, a symbolic link that leaves the folder — and checks that
`Plan.device_plan` refuses each with a PlanError naming the manifest and
the file, while the untouched plan still loads. A trap file outside the
folder holds a valid plan.json: reading it would succeed, so only a refusal
passes. One JSON line per case, `{"case", "ok", "detail"}`.
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import source_plan  # noqa: E402

plan_mod = source_plan.load()


def main():
    src, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    trap = os.path.join(work, "trap.json")
    base = os.path.join(work, "plan")
    shutil.copytree(src, base)
    manifest = json.load(open(os.path.join(base, "manifest.json")))
    device = manifest["targets"][0]["device"]
    rel = manifest["devices"][device]["files"]["plan"]
    shutil.copy(os.path.join(base, rel), trap)
    os.symlink(trap, os.path.join(base, device, "link.json"))
    ok_all = True

    def case(name, fn):
        nonlocal ok_all
        try:
            detail = fn()
            ok = True
        except AssertionError as e:
            ok, detail = False, str(e)
        ok_all &= ok
        print(json.dumps({"case": name, "ok": ok, "detail": detail}), flush=True)

    def loads():
        p = plan_mod.Plan.load(base)
        assert p.device_plan(device), "the plan's own file did not load"
        return "loaded"

    case("own files", loads)
    for name, bad in [("absolute", os.path.abspath(trap)), ("dotdot", "../trap.json"),
                      ("dotdot inside", f"{device}/../../trap.json"), ("symlink out", f"{device}/link.json")]:
        def refused(bad=bad):
            m = json.loads(json.dumps(manifest))
            m["devices"][device]["files"]["plan"] = bad
            d = os.path.join(work, "bad")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(base, d, symlinks=True)
            json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
            try:
                plan_mod.Plan.load(d).device_plan(device)
            except plan_mod.PlanError as e:
                msg = str(e)
                assert "manifest.json" in msg and repr(bad) in msg, f"the refusal does not name the file: {msg}"
                return msg
            raise AssertionError(f"{bad!r} was read")
        case(name, refused)
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
