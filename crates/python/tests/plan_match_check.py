"""A plan applied to a model it was not made for is refused; refreshed
copies follow their masters.

Plans the example's transformer (`examples/train_ddp.py plan`), then:

- `apply_plan` on the example's ResNet-18 raises `PlanError` naming the model
  the plan was made for, how many planned operators name modules ResNet-18
  lacks, and the first of them; `partial=True` applies the rest and lists
  exactly those as unmapped;
- the example's `train` takes its model from the plan: `model_for(plan,
  None)` is the transformer, and `--model resnet18` with that plan is
  refused;
- on the transformer, the plan applies; each weight the plan keeps as a
  refreshed copy is held in FP16, rewritten by the optimizer step's hook
  (`apply_plan(..., optimizer=opt)`), and a master changed without a step
  (in place, as DDP's initial broadcast does) is re-read before the next
  forward uses its copy.

Prints one JSON line per check; exits 1 if any fails.

usage: plan_match_check.py QSYNCC WORK_DIR
"""

import json
import os
import subprocess
import sys

import torch

import qsync

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../..")
sys.path.insert(0, os.path.join(ROOT, "examples"))
import train_ddp  # noqa: E402

FAILED = []


def check(name, ok, **info):
    print(json.dumps({"check": name, "ok": bool(ok), **info}), flush=True)
    if not ok:
        FAILED.append(name)


def main():
    qsyncc, work = sys.argv[1:3]
    out = os.path.join(work, "transformer-plan")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples/train_ddp.py"), "plan", "--model", "transformer",
                        "--targets", "v100:1,t4:1", "--batch", "2", "-o", out],
                       capture_output=True, text=True, env=dict(os.environ, QSYNCC=qsyncc))
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        sys.exit(1)
    plan = qsync.Plan.load(out)
    check("the manifest names the model", plan.model_name == "transformer" and plan.model_sha256,
          model=plan.model_name)

    # The wrong model: refused, with the first missing module and the count.
    planned = [n for n in plan.device_plan("v100")["nodes"] if n.get("planned")]
    try:
        qsync.apply_plan(train_ddp.make_model("resnet18", 0), out, "v100")
        err = None
    except qsync.PlanError as e:
        err = str(e)
    report = qsync.apply_plan(train_ddp.make_model("resnet18", 0), out, "v100", partial=True)
    missing = report.unmapped
    first = next((n.get("module") for n in planned if missing and n["name"] == missing[0][0]), None)
    check("a plan for another model is refused",
          err is not None and len(missing) > len(planned) // 2 and f"`{first}`" in err
          and f"{len(missing)} of its {len(planned)}" in err and "transformer" in err and "partial=True" in err,
          error=err, missing=len(missing))
    check("partial=True applies what maps and lists the rest",
          len(report.mapped) + len(report.unmapped) == len(planned), unmapped=len(report.unmapped),
          mapped=len(report.mapped))

    # The example builds the plan's model.
    try:
        train_ddp.model_for(plan, "resnet18")
        refused = None
    except SystemExit as e:
        refused = str(e)
    check("train_ddp builds the plan's model", train_ddp.model_for(plan, None) == "transformer"
          and refused is not None and "made for model 'transformer'" in refused, refused=refused)

    # The right model: refreshed copies held, rewritten by the step, never stale.
    torch.manual_seed(0)
    model = train_ddp.make_model("transformer", 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    report = qsync.apply_plan(model, out, "v100", optimizer=opt)
    listed = plan.device_plan("v100").get("refreshed_copies", [])
    copies = report.copies
    check("the plan's refreshed copies are held in FP16",
          len(listed) > 0 and len(copies) == len(listed) and not report.unmapped_copies
          and all(c.tensor.dtype == torch.float16 for c in copies),
          held=len(copies), listed=len(listed))
    x = train_ddp.example_input("transformer", 4)
    y = torch.randint(0, 10, (4,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = all(c.master.grad is not None and c.master.grad.dtype == torch.float32 for c in copies)
    opt.step()
    fresh = all(torch.equal(c.tensor, c.master.detach().half()) and c.refreshes == 2 for c in copies)
    check("the optimizer step rewrites every copy; FP32 gradients reach the masters", grads and fresh)
    c = copies[0]
    with torch.no_grad():
        c.master.mul_(2.0)
    model(x)
    check("a master changed outside a step is re-read before its copy is used",
          torch.equal(c.tensor, c.master.detach().half()), copy=c.name)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
