"""ComfyUI's `comfy.model_management` for custom node packs: the device mixgraph runs on,
interrupt checks of the running prompt, cache emptying and memory figures. Loading models onto
the GPU is mixgraph's weight store's job: `load_models_gpu` and ModelPatcher-level memory
management are ComfyUI internals not provided."""

from __future__ import annotations

import enum
import gc
import os

import torch

from mixgraph.graph.context import Interrupted
import mixgraph.ui.comfy.comfy_runtime as _rt

InterruptProcessingException = Interrupted
OOM_EXCEPTION = torch.cuda.OutOfMemoryError
DISABLE_SMART_MEMORY = False


class VRAMState(enum.Enum):
    DISABLED = 0
    NO_VRAM = 1
    LOW_VRAM = 2
    NORMAL_VRAM = 3
    HIGH_VRAM = 4
    SHARED = 5


class CPUState(enum.Enum):
    GPU = 0
    CPU = 1
    MPS = 2


def get_torch_device() -> torch.device:
    return torch.device(_rt.current_env().device or "cpu")


cpu_state = CPUState.CPU if get_torch_device().type == "cpu" else CPUState.GPU
vram_state = VRAMState.SHARED if cpu_state == CPUState.CPU else VRAMState.NORMAL_VRAM


def get_torch_device_name(device: torch.device | None = None) -> str:
    device = device or get_torch_device()
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)}"
    return str(device)


def intermediate_device() -> torch.device:
    return torch.device("cpu")     # tensors between nodes live on the CPU in mixgraph


def unet_offload_device() -> torch.device:
    return torch.device("cpu")


def text_encoder_device() -> torch.device:
    return get_torch_device()


def vae_device() -> torch.device:
    return get_torch_device()


def unet_inital_load_device(*args, **kwargs) -> torch.device:
    return torch.device("cpu")


def is_device_cpu(device) -> bool:
    return torch.device(device).type == "cpu"


def is_device_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def is_device_mps(device) -> bool:
    return torch.device(device).type == "mps"


def cpu_mode() -> bool:
    return get_torch_device().type == "cpu"


def mps_mode() -> bool:
    return get_torch_device().type == "mps"


def is_intel_xpu() -> bool:
    return False


def directml_enabled() -> bool:
    return False


def xformers_enabled() -> bool:
    return False


def pytorch_attention_enabled() -> bool:
    return True


def should_use_fp16(device=None, model_params=0, prioritize_performance=True, manual_cast=False) -> bool:
    device = torch.device(device) if device is not None else get_torch_device()
    return device.type == "cuda"


def should_use_bf16(device=None, model_params=0, prioritize_performance=True, manual_cast=False) -> bool:
    device = torch.device(device) if device is not None else get_torch_device()
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def device_supports_non_blocking(device) -> bool:
    return torch.device(device).type == "cuda"


def cast_to_device(tensor: torch.Tensor, device, dtype, copy: bool = False) -> torch.Tensor:
    return tensor.to(device=device, dtype=dtype, copy=copy)


def module_size(module: torch.nn.Module) -> int:
    return sum(t.nelement() * t.element_size() for t in module.state_dict().values())


def get_total_memory(dev=None, torch_total_too=False):
    dev = torch.device(dev) if dev is not None else get_torch_device()
    if dev.type == "cuda":
        total = torch.cuda.mem_get_info(dev)[1]
        return (total, torch.cuda.memory_reserved(dev)) if torch_total_too else total
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return (total, total) if torch_total_too else total


def get_free_memory(dev=None, torch_free_too=False):
    dev = torch.device(dev) if dev is not None else get_torch_device()
    if dev.type == "cuda":
        free = torch.cuda.mem_get_info(dev)[0]
        torch_free = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return (free + torch_free, torch_free) if torch_free_too else free + torch_free
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if ":" in line}
        free = info.get("MemAvailable", info.get("MemFree", 0))
    except OSError:
        free = 0
    return (free, free) if torch_free_too else free


def soft_empty_cache(force: bool = False) -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def unload_all_models() -> None:
    """Drops mixgraph's materialized weights (the weight store), as ComfyUI unloads its models."""
    from mixgraph.nodes.weights import store
    store.clear()


def cleanup_models(*args, **kwargs) -> None:
    gc.collect()


def load_models_gpu(*args, **kwargs):
    raise _rt.missing("comfy.model_management.load_models_gpu (ModelPatcher loading)")


def load_model_gpu(*args, **kwargs):
    raise _rt.missing("comfy.model_management.load_model_gpu (ModelPatcher loading)")


def processing_interrupted() -> bool:
    now = _rt.running()
    if now is None:
        return False
    try:
        now.ctx.check_interrupt()
    except Interrupted:
        return True
    return False


def throw_exception_if_processing_interrupted() -> None:
    now = _rt.running()
    if now is not None:
        now.ctx.check_interrupt()


def interrupt_current_processing(value: bool = True) -> None:
    """Stop the running prompt (ComfyUI's flag; clearing it is the executor's business)."""
    now = _rt.running()
    run = getattr(now.ctx, "_run", None) if now is not None else None
    if value and run is not None:
        run.interrupt.set()
