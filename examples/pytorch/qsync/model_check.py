"""Does QSync take a model as it is? ``check_model(model, forward_loss)`` runs what the
planner and the plan applier need of it, on the CPU or a GPU, in seconds at a toy size:

1. ``export.record_ops`` records one step at fp32 and ``qsync_model.model_json`` makes
   the model JSON lowbit-plan reads;
2. every parameter is counted once: by the op that takes it first, or as unused (no op
   took it: a branch the step does not run); those without requires_grad as frozen;
3. a uniform bf16 plan is applied and must wrap nothing (it is the profiled program
   itself), then a mixed one (the first and the middle parameter op kept at fp32 in a
   bf16 step), and, with ``fp8_device``, a plan whose default is fp8 on that device:
   each trains one step, with a finite loss and finite gradients.

A failure raises ``ModelCheckError`` saying which step and plan, with the cause chained.
The model is left on the device the last plan ran on, its gradients set."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import export as ex
from . import qsync_model as qm
from .apply_plan import applied_plan


class ModelCheckError(RuntimeError):
    """What check_model found wrong, naming the step and the plan."""


def _counted(model: torch.nn.Module, model_json: dict) -> None:
    ops = model_json["ops"]
    unused = model_json.get("unused_params", {}).get("numel", 0)
    counted = sum(o["param_numel"] for o in ops) + unused
    total = sum(p.numel() for p in model.parameters())
    if counted != total:
        raise ModelCheckError("the ops and unused_params count %d parameters of the model's %d"
                              % (counted, total))
    frozen = sum(o.get("frozen_numel", 0) for o in ops)
    without_grad = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    if frozen > without_grad:
        raise ModelCheckError("%d parameters counted as frozen, %d have no requires_grad"
                              % (frozen, without_grad))
    if not any(o["param_numel"] > 0 for o in ops):
        raise ModelCheckError("no op holds a parameter: nothing for a plan to decide")


def step_under_plan(model: torch.nn.Module, plan: dict, model_json: dict,
                    forward_loss: Callable[[], torch.Tensor], device_type: str = "cpu"):
    """One training step's forward (in the plan's step context) and backward with `plan`
    applied, gradients set afresh: (the applied plan, left; the loss)."""
    model.zero_grad(set_to_none=True)
    with applied_plan(model, plan, model_json, device_type=device_type) as ap:
        with ap.step_context():
            loss = forward_loss()
        loss.backward()
    return ap, loss


def check_model(model: torch.nn.Module, forward_loss: Callable[[], torch.Tensor],
                name: str = "model", device_type: str = "cpu",
                fp8_device: Optional[str] = None) -> dict:
    """Checks `model` (in training mode, on `device_type`) with `forward_loss` (forward on
    a fixed batch, returning the loss) as the module docstring says; returns its model
    JSON. `fp8_device` ("cuda", or "cpu" where torch._scaled_mm runs there) adds a plan
    whose default is fp8, run with the model moved there: `forward_loss` must then put
    its batch where the model is."""
    try:
        model_json = qm.model_json(ex.record_ops(model, forward_loss, "fp32",
                                                 device_type=device_type), name)
    except Exception as e:  # noqa: BLE001 (any failure is the model's report)
        raise ModelCheckError("%s: export failed: %s: %s" % (name, type(e).__name__, e)) from e
    _counted(model, model_json)
    params = [o["name"] for o in model_json["ops"] if o["param_numel"] > 0]
    mixed = {"default": "bf16", "ops": {params[0]: "fp32", params[len(params) // 2]: "fp32"}}
    plans = [("uniform bf16", qm.uniform_plan("bf16"), device_type),
             ("mixed", mixed, device_type)]
    if fp8_device:
        plans.append(("fp8", {"default": "fp8"}, fp8_device))
    for label, plan, device in plans:
        try:
            ap, loss = step_under_plan(model.to(device), plan, model_json, forward_loss, device)
        except Exception as e:  # noqa: BLE001
            raise ModelCheckError("%s: the %s plan failed: %s: %s"
                                  % (name, label, type(e).__name__, e)) from e
        if label == "uniform bf16" and ap.wrapped:
            raise ModelCheckError("%s: a uniform plan wrapped %s" % (name, sorted(ap.wrapped)))
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not torch.isfinite(loss).all() or not grads or \
                not all(torch.isfinite(g).all() for g in grads):
            raise ModelCheckError("%s: the %s plan gave a non-finite loss or gradient, or none"
                                  % (name, label))
    return model_json
