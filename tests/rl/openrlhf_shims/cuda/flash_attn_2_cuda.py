"""Test-only stand-in for flash-attn's compiled CUDA extension, which cannot exist on a CPU machine.

flash-attn's Python package (installed without its kernels: FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE) imports this
extension at the top of ``flash_attn/__init__.py``; OpenRLHF imports flash-attn's padding helpers at the top of
``openrlhf/models``.  The tests never run attention kernels: any use raises.
"""


def __getattr__(name: str):
    raise ImportError(f"flash_attn_2_cuda.{name}: flash-attn's CUDA kernels do not exist on a CPU (test stand-in)")
