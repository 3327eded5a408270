#!/opt/loom/venv/bin/python3
"""DeepSpeed ZeRO checkpoints as `engine.save_checkpoint(save_dir, tag)` lays them out, written from
a full fp32 state dict, and read back the way DeepSpeed's `zero_to_fp32.py` reads them.

No DeepSpeed import: the layout is written from DeepSpeed's definitions
(docs/design/TECHNIQUES.md §1.3, §5.1, §5.2; deepspeed/runtime/engine.py `_save_checkpoint`/`_save_zero_checkpoint`,
runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, utils/zero_to_fp32.py), so that tests and
benchmarks can make DeepSpeed-layout checkpoints of any size with PyTorch 2.11 (the project venv)
(/opt/loom/venv/bin/python3, torch 2.11).

Layout written by `write(save_dir, tensors, world_size, stage)` (N = world_size):

  save_dir/latest                                       the tag, e.g. "global_step1"
  save_dir/<tag>/mp_rank_00_model_states.pt             stage 0/1/2 (one model-parallel rank)
  save_dir/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt   stage 3: one per data-parallel rank
  save_dir/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   stage >= 1: one per rank

Each file is a `torch.save` pickle of a dict:
  model states: module (stage 0-2: the full weights, in the training dtype; stage 3: empty
    placeholders for the partitioned parameters), buffer_names [], param_shapes [OrderedDict
    name -> torch.Size] (one group, in flattening order), frozen_param_shapes OrderedDict
    name -> torch.Size and frozen_param_fragments {name: tensor} of the frozen (requires_grad=
    False) parameters, in their own dtype (stage 2: the whole parameter; stage 3: each rank's
    file holds its 1-D ds_tensor partition of ceil(n/N) elements, zero-padded, as
    engine._get_zero_frozen_param_attributes saves them), shared_params {}, optimizer None,
    lr_scheduler None, global_steps,
    global_samples, skipped_steps 0, dp_world_size N, mp_world_size 1, ds_config, ds_version.
  optim states: {optimizer_state_dict: {zero_stage, partition_count N, loss_scaler None,
    dynamic_loss_scale False, overflow False, optimizer_state_dict (the base Adam state of the
    local partition: `state` holds exp_avg / exp_avg_sq flats when `moments` is given, else {}),
    and the fp32 master partition:
      stage 1/2  single_partition_of_fp32_groups = [flat of L/N elements]: the group's params
                 flattened in order, padded with zeros at the end to L = a multiple of 2N, and
                 partition r = elements [r L/N, (r+1) L/N).
      stage 3    fp32_flat_groups = [sub-group flats]: each param partitioned on its own,
                 p = ceil(n/N), rank r holds elements [r p, min((r+1) p, n)) zero-padded to p,
                 params concatenated in order with no alignment, cut into sub-groups at param
                 boundaries once a sub-group reaches `sub_group_size` elements.},
    ds_config, ds_version}.
All tensors are fp32, contiguous, little-endian (CPU). Not thread-safe (writes files).
"""
import collections
import json
import os
import re

import torch

DS_VERSION = "0.16.4"


def _install_deepspeed_stand_ins():
    """Real ZeRO optimizer states pickle two DeepSpeed objects: `zero_stage` as
    deepspeed.runtime.zero.config.ZeroStageEnum (an int Enum) and, under fp16, `loss_scaler` as a
    deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler instance. Without DeepSpeed installed,
    classes of the same module and name (and the same pickled form) stand in for them, so that
    write(..., deepspeed_objects=True) produces those pickles and torch.load can read them back."""
    import enum
    import sys
    import types
    try:
        import deepspeed  # noqa: F401
        return
    except ImportError:
        pass
    names = ["deepspeed", "deepspeed.runtime", "deepspeed.runtime.zero",
             "deepspeed.runtime.zero.config", "deepspeed.runtime.fp16",
             "deepspeed.runtime.fp16.loss_scaler"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    config = sys.modules["deepspeed.runtime.zero.config"]
    if not hasattr(config, "ZeroStageEnum"):
        class ZeroStageEnum(int, enum.Enum):
            disabled = 0
            optimizer_states = 1
            gradients = 2
            weights = 3
        ZeroStageEnum.__module__ = config.__name__
        ZeroStageEnum.__qualname__ = "ZeroStageEnum"
        config.ZeroStageEnum = ZeroStageEnum
    scaler = sys.modules["deepspeed.runtime.fp16.loss_scaler"]
    if not hasattr(scaler, "DynamicLossScaler"):
        class DynamicLossScaler:  # DeepSpeed's constructor arguments, its pickled attributes
            def __init__(self, init_scale, scale_window, min_scale, delayed_shift,
                         consecutive_hysteresis):
                self.cur_scale = init_scale
                self.cur_iter = 0
                self.scale_window = scale_window
                self.min_scale = min_scale
                self.delayed_shift = delayed_shift
                self.consecutive_hysteresis = consecutive_hysteresis
                self.dynamic = True
        DynamicLossScaler.__module__ = scaler.__name__
        DynamicLossScaler.__qualname__ = "DynamicLossScaler"
        scaler.DynamicLossScaler = DynamicLossScaler


_install_deepspeed_stand_ins()


def partitioned_numel(numel, world_size):
    """Stage 3: elements per rank of a parameter of `numel` elements (ceil(numel / N))."""
    return -(-numel // world_size)


def _ds_config(world_size, stage, bf16):
    return {"train_batch_size": world_size, "zero_optimization": {"stage": stage},
            "bf16": {"enabled": bool(bf16)}}


def _stage3_partition(full, rank, world_size, dtype=torch.float32):
    """Rank `rank`'s zero-padded partition of `full` (flattened), p = ceil(n/N) elements."""
    flat = full.reshape(-1)
    p = partitioned_numel(flat.numel(), world_size)
    part = torch.zeros(p, dtype=dtype)
    lo, hi = min(rank * p, flat.numel()), min((rank + 1) * p, flat.numel())
    part[: hi - lo] = flat[lo:hi]
    return part


def _stage3_flats(tensors, names, rank, world_size, sub_group_size):
    """Rank `rank`'s fp32 flat groups: its partitions, param after param, in sub-groups."""
    groups, current, current_numel = [], [], 0
    for name in names:
        current.append(_stage3_partition(tensors[name], rank, world_size))
        current_numel += current[-1].numel()
        if current_numel >= sub_group_size:
            groups.append(torch.cat(current))
            current, current_numel = [], 0
    if current or not groups:
        groups.append(torch.cat(current) if current else torch.zeros(0))
    return groups


def _stage12_partition(tensors, names, rank, world_size):
    """Rank `rank`'s slice of the group's flat vector padded to a multiple of 2N elements."""
    total = sum(tensors[n].numel() for n in names)
    alignment = 2 * world_size
    padded = -(-total // alignment) * alignment
    size = padded // world_size
    lo, hi = rank * size, (rank + 1) * size
    part = torch.zeros(size, dtype=torch.float32)
    offset = 0
    for n in names:
        flat = tensors[n].reshape(-1)
        a, b = max(lo, offset), min(hi, offset + flat.numel())
        if a < b:
            part[a - lo: b - lo] = flat[a - offset: b - offset]
        offset += flat.numel()
    return part


def write(save_dir, tensors, world_size, stage, tag="global_step1", moments=None, bf16=False,
          sub_group_size=1_000_000_000, global_steps=1, groups=None, shared_params=None,
          deepspeed_objects=False, frozen=None):
    """Writes `tensors` (ordered {name: fp32 tensor}, the model's named_parameters order) as a
    DeepSpeed ZeRO-`stage` checkpoint of `world_size` data-parallel ranks; returns save_dir/tag.

    moments: optional {name: (exp_avg, exp_avg_sq)} of the same shapes, partitioned like the
    weights into the base optimizer state (as DeepSpeed's Adam state of the flat partition).
    bf16: name the optim files bf16_zero_pp_rank_... and store the stage 0-2 module in bf16.
    groups: optional list of name lists, the optimizer param groups in order (default: one group
      of every name): param_shapes gets one OrderedDict per group; stage 1/2 one padded flat
      partition per group; stage 3 sub-groups per group, in group order.
    shared_params: optional {alias: source}: tied weights. The alias must not be in `tensors`
      (DeepSpeed's named_parameters lists a tied Parameter once); it is recorded in the model
      states' shared_params and read back as the source's tensor.
    deepspeed_objects: pickle zero_stage as DeepSpeed's ZeroStageEnum and loss_scaler as a
      DynamicLossScaler instance, as real DeepSpeed optimizer states do (stand-in classes when
      DeepSpeed is absent: _install_deepspeed_stand_ins).
    frozen: optional ordered {name: tensor} of frozen parameters (float32, bfloat16 or float16;
      stage 2 or 3 only, as DeepSpeed saves them only when it partitions gradients): recorded in
      frozen_param_shapes / frozen_param_fragments, not in param_shapes or the fp32 partitions.
    Raises ValueError on a bad stage, world size, non-fp32 tensor, mismatched moments or groups.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError("stage: %r (must be 0, 1, 2 or 3)" % (stage,))
    if world_size < 1:
        raise ValueError("world_size: %r (must be >= 1)" % (world_size,))
    names = list(tensors)
    groups = [list(g) for g in groups] if groups is not None else [names]
    if sorted(n for g in groups for n in g) != sorted(names):
        raise ValueError("groups: must list every tensor name exactly once")
    names = [n for g in groups for n in g]
    frozen = collections.OrderedDict(frozen or {})
    if frozen and stage < 2:
        raise ValueError("frozen: DeepSpeed saves frozen parameters only at stage 2 or 3")
    if any(n in tensors for n in frozen):
        raise ValueError("frozen: a name is also a trainable tensor")
    shared_params = dict(shared_params or {})
    for alias, source in shared_params.items():
        if alias in tensors or alias in frozen or (source not in tensors and source not in frozen):
            raise ValueError("shared_params[%r]: the alias must be absent, the source present" % alias)
    for n in names:
        if tensors[n].dtype != torch.float32:
            raise ValueError("tensors[%r]: dtype %s, expected torch.float32" % (n, tensors[n].dtype))
        if moments is not None and (n not in moments or any(
                m.shape != tensors[n].shape for m in moments[n])):
            raise ValueError("moments[%r]: missing or shaped unlike the parameter" % n)
    tag_dir = os.path.join(save_dir, tag)
    os.makedirs(tag_dir, exist_ok=True)
    config = _ds_config(world_size, stage, bf16)
    param_shapes = [collections.OrderedDict((n, tensors[n].shape) for n in g) for g in groups]

    frozen_shapes = collections.OrderedDict((n, v.shape) for n, v in frozen.items())

    def model_states(module, fragments):
        return {"module": module, "buffer_names": [], "param_shapes": param_shapes,
                "frozen_param_shapes": frozen_shapes, "frozen_param_fragments": fragments,
                "shared_params": shared_params, "optimizer": None, "lr_scheduler": None,
                "global_steps": global_steps, "global_samples": global_steps * world_size,
                "skipped_steps": 0, "dp_world_size": world_size, "mp_world_size": 1,
                "ds_config": config, "ds_version": DS_VERSION}

    if stage < 3:
        dtype = torch.bfloat16 if bf16 else torch.float32
        module = collections.OrderedDict((n, tensors[n].to(dtype)) for n in names)
        module.update((n, v.clone()) for n, v in frozen.items())
        fragments = collections.OrderedDict((n, v.detach().clone()) for n, v in frozen.items())
        torch.save(model_states(module, fragments),
                   os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
        del module
    else:
        placeholders = collections.OrderedDict((n, torch.empty(0)) for n in names + list(frozen))
        for r in range(world_size):
            fragments = collections.OrderedDict(
                (n, _stage3_partition(v, r, world_size, v.dtype)) for n, v in frozen.items())
            torch.save(model_states(placeholders, fragments),
                       os.path.join(tag_dir, "zero_pp_rank_%d_mp_rank_00_model_states.pt" % r))
    if stage == 0:
        with open(os.path.join(save_dir, "latest"), "w") as f:
            f.write(tag)
        return tag_dir

    prefix = "bf16_" if bf16 else ""
    for r in range(world_size):
        if stage == 3:
            fp32 = [f for g in groups
                    for f in _stage3_flats(tensors, g, r, world_size, sub_group_size)]
            key = "fp32_flat_groups"
        else:
            fp32 = [_stage12_partition(tensors, g, r, world_size) for g in groups]
            key = "single_partition_of_fp32_groups"
        state = {}
        if moments is not None:
            for i, which in enumerate(("exp_avg", "exp_avg_sq")):
                view = {n: moments[n][i] for n in names}
                flats = ([f for g in groups
                          for f in _stage3_flats(view, g, r, world_size, sub_group_size)]
                         if stage == 3 else
                         [_stage12_partition(view, g, r, world_size) for g in groups])
                for g, flat in enumerate(flats):
                    state.setdefault(g, {"step": torch.tensor(float(global_steps))})[which] = flat
        base = {"state": state,
                "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                  "weight_decay": 0.0, "params": list(range(len(fp32)))}]}
        zero_stage, loss_scaler = stage, None
        if deepspeed_objects:
            import deepspeed.runtime.fp16.loss_scaler as ds_scaler
            import deepspeed.runtime.zero.config as ds_config
            zero_stage = ds_config.ZeroStageEnum(stage)
            # DeepSpeed's fp16 defaults (runtime/fp16/loss_scaler.py); the real class when
            # DeepSpeed is installed (the project venv has it), else the stand-in above.
            loss_scaler = ds_scaler.DynamicLossScaler(
                init_scale=2.0 ** 16, scale_window=1000, min_scale=1, delayed_shift=2,
                consecutive_hysteresis=False)
        optim = {"optimizer_state_dict": {
            "zero_stage": zero_stage, "partition_count": world_size, "loss_scaler": loss_scaler,
            "dynamic_loss_scale": False, "overflow": False, "optimizer_state_dict": base,
            key: fp32}, "ds_config": config, "ds_version": DS_VERSION}
        torch.save(optim, os.path.join(
            tag_dir, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt" % (prefix, r)))
        del optim, fp32, state
    with open(os.path.join(save_dir, "latest"), "w") as f:
        f.write(tag)
    return tag_dir


def _natural_key(path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def read_fp32_state_dict(save_dir, tag=None):
    """The full fp32 state dict of a ZeRO checkpoint, reconstructed as DeepSpeed's zero_to_fp32.py
    `get_fp32_state_dict_from_zero_checkpoint` does (docs/design/TECHNIQUES.md §5.2): torch.load of
    every model-states and optim-states file, stage 1/2: cat of the partitions walked with param_shapes;
    stage 3: per param cat over ranks of rank_r[o : o + ceil(n/N)], first n elements, view(shape).
    Frozen parameters as _zero2_merge_frozen_params (the stored fragment) and
    _zero3_merge_frozen_params (cat of every rank's fragment, first n elements, view(shape)) do,
    in their stored dtype.
    Returns an OrderedDict name -> tensor. Raises ValueError naming the file on a bad layout."""
    if tag is None:
        with open(os.path.join(save_dir, "latest")) as f:
            tag = f.read().strip()
    ckpt = os.path.join(save_dir, tag)
    files = sorted(os.listdir(ckpt), key=_natural_key)
    model_files = [os.path.join(ckpt, f) for f in files if f.endswith("_model_states.pt")]
    optim_files = [os.path.join(ckpt, f) for f in files if f.endswith("_optim_states.pt")]
    if not model_files:
        raise ValueError("%s: no *_model_states.pt" % ckpt)
    # weights_only=False (torch >= 2.6 defaults to True): DeepSpeed pickles non-tensor objects in
    # its checkpoints and its own zero_to_fp32 loads them the same way; these files are our own.
    model0 = torch.load(model_files[0], map_location="cpu", weights_only=False)
    groups = model0["param_shapes"]
    if isinstance(groups, dict):
        groups = [groups]
    param_shapes = collections.OrderedDict()
    for group in groups:
        param_shapes.update(group)
    shared = model0.get("shared_params") or {}
    if not optim_files:  # stage 0: the module holds the weights
        return collections.OrderedDict((n, model0["module"][n].float()) for n in param_shapes)
    optims = [torch.load(f, map_location="cpu", weights_only=False)["optimizer_state_dict"] for f in optim_files]
    stage = int(optims[0]["zero_stage"])
    world_size = optims[0]["partition_count"]
    if isinstance(world_size, list):
        world_size = max(world_size)
    if len(optims) != world_size:
        raise ValueError("%s: %d optim files, partition_count %d" % (ckpt, len(optims), world_size))
    state = collections.OrderedDict()
    frozen_shapes = model0.get("frozen_param_shapes") or {}
    if stage <= 2:
        for name in frozen_shapes:
            state[name] = model0["frozen_param_fragments"][name]
        for g, group in enumerate(groups):
            full = torch.cat([o["single_partition_of_fp32_groups"][g] for o in optims])
            offset = 0
            for name, shape in group.items():
                n = shape.numel()
                state[name] = full.narrow(0, offset, n).view(shape)
                offset += n
            align = 2 * world_size
            if -(-offset // align) != -(-full.numel() // align):
                raise ValueError("%s: group %d: consumed %d of %d elements"
                                 % (ckpt, g, offset, full.numel()))
        for alias, source in shared.items():
            state[alias] = state[source]
        return state
    if frozen_shapes:
        models = [torch.load(f, map_location="cpu", weights_only=False) for f in model_files]
        for name, shape in frozen_shapes.items():
            frags = tuple(m["frozen_param_fragments"][name] for m in models)
            state[name] = torch.cat(frags, 0).narrow(0, 0, shape.numel()).view(shape)
        del models
    flats = [torch.cat(o["fp32_flat_groups"], 0) for o in optims]
    offset = 0
    for name, shape in param_shapes.items():
        n = shape.numel()
        p = partitioned_numel(n, world_size)
        state[name] = torch.cat(tuple(f.narrow(0, offset, p) for f in flats), 0).narrow(
            0, 0, n).view(shape)
        offset += p
    if offset * world_size != flats[0].numel() * world_size:
        raise ValueError("%s: consumed %d of %d elements per rank" % (ckpt, offset, flats[0].numel()))
    for alias, source in shared.items():
        state[alias] = state[source]
    return state


def save_safetensors(path, state, fsync=True):
    """Writes fp32 `state` as safetensors the way the reference writer does
    (docs/design/TECHNIQUES.md §5.3: __metadata__ {"format": "pt"} first, tensors sorted by name (one dtype), compact JSON padded
    with spaces to a multiple of 8, u64 little-endian header length), then fsyncs it."""
    names = sorted(state)
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for k in names:
        if state[k].dtype != torch.float32:
            raise ValueError("state[%r]: dtype %s, expected torch.float32" % (k, state[k].dtype))
        nb = state[k].numel() * 4
        header[k] = {"dtype": "F32", "shape": list(state[k].shape), "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for k in names:
            f.write(state[k].contiguous().numpy().data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    return 8 + len(h) + off
