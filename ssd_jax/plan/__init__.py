"""Will it fit, and how fast: a target/draft pair on real devices, sized and estimated before anyone pays for them.

  configs.py   the paper's models as ModelConfig values (the one place named shapes come from)
  devices.py   H100 / H200 (analytic) and TPU v5e / v5p / v6e (compiled for through libtpu topologies)
  memory.py    parameter, KV cache and speculation cache bytes per device, by the decoders' own sharding rules
  estimate.py  step times from bytes, FLOPs, collectives and launches; AR / SD / SSD tok/s by the timing model
  programs.py  every program of an SSD round as the decoders call it, over abstract placed arrays
  compile.py   compiling those for a topology and reading the compiler's memory per device
  report.py    the plan as a dict and as text, beside the paper's figures

scripts/plan.py is the command line.
"""
from __future__ import annotations

from .compile import compile_round, tpu_devices
from ..models.config import check_same_vocabulary
from .configs import CONFIGS, named
from .devices import device, topology_name
from .estimate import calibrate
from .programs import Layout
from .report import facts, format_compiled, format_memory, format_speed, memory_plan, setting_for, speed_plan

__all__ = ["make_plan", "format_plan"]


def make_plan(target: str, draft: str, target_devices: int, device_name: str, dtype: str = "bfloat16",
              batch: int = 1, prompt: int = 128, new_tokens: int = 512, k=None, sd_k=None, fan_out=None,
              p_hit: float = 0.9, acceptance: float = 0.8, attn_impl: str = "pallas", compile_tpu: bool = True,
              depths=(2, 4), slice_shape: str | None = None, calibration: dict | None = None, log=None) -> dict:
  """Returns the plan: memory per device, the estimate beside the paper's figures, facts, and for a TPU the
  compiler's view of every program (depths None: full depth). Arguments as scripts/plan.py's flags."""
  tcfg, dcfg = named(target), named(draft)
  check_same_vocabulary(dcfg, tcfg, dcfg.name)
  if target_devices < 1 or batch < 1 or prompt < 1 or new_tokens < 1:
    raise ValueError("--target-devices, --batch, --prompt and --new-tokens must be >= 1")
  dev = device(device_name)
  if calibration is not None:
    dev = calibrate(dev, calibration, {**CONFIGS, tcfg.name: tcfg, dcfg.name: dcfg})
  s = setting_for(tcfg, dcfg, batch=batch, k=k, sd_k=sd_k, fan_out=fan_out, p_hit=p_hit)
  mem = memory_plan(tcfg, dcfg, target_devices, dev, dtype, s, prompt, new_tokens, attn_impl)
  plan = dict(target=tcfg.name, draft=dcfg.name, target_devices=target_devices, device=dev.name, device_figures=dev,
              calibrated=calibration is not None, dtype=dtype,
              setting=s, prompt=prompt, new_tokens=new_tokens, attn_impl=attn_impl, memory=mem,
              speed=speed_plan(tcfg, dcfg, target_devices, dev, dtype, s, acceptance),
              facts=facts(tcfg, dcfg, target_devices, dev, dtype, s, prompt, mem))
  if dev.platform == "tpu" and compile_tpu:
    if dtype == "int8":
      raise ValueError("int8 weights are sized, not compiled, by the plan (--no-compile); quant.py runs them")
    topo = topology_name(dev, target_devices + 1, slice_shape)
    devs = tpu_devices(topo)
    if len(devs) < target_devices + 1:
      raise ValueError(f"{topo} has {len(devs)} chips; the plan needs {target_devices} + 1 for the draft")
    layout = Layout(tuple(devs[:target_devices]), devs[target_devices])
    plan["topology"] = topo
    plan["compiled"] = compile_round(tcfg, dcfg, layout, depths, log=log, dtype=dtype, batch=batch, prompt=prompt,
                                     slots_t=mem["target_slots"], slots_d=mem["draft_slots"], k=s.k,
                                     fan_out=s.fan_out, sd_k=s.sd_k, attn_impl=attn_impl)
  return plan


def format_plan(plan: dict) -> str:
  """Returns the plan as text."""
  dev = plan["device_figures"]
  s = plan["setting"]
  lines = [f"Plan: {plan['target']} over {plan['target_devices']} x {plan['device']} (tensor parallel) + "
           f"{plan['draft']} on one more; weights {plan['dtype']}; batch {s.batch}, prompt {plan['prompt']} + "
           f"{plan['new_tokens']} new tokens; attention {plan['attn_impl']}", ""]
  lines += format_memory(plan["memory"], dev, plan["target_devices"]) + [""]
  lines += format_speed(plan["speed"], s, dev)
  if plan["calibrated"]:
    lines.append("  (achieved bandwidth and per-kernel latency fitted to the --calibration run's steps)")
  lines += [""]
  lines += ["Facts"] + [f"  - {f}" for f in plan["facts"]]
  if "compiled" in plan:
    lines += [""] + format_compiled(plan["compiled"], plan["topology"], dev)
  return "\n".join(lines)
