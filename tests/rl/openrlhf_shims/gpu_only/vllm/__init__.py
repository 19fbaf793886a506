"""Test-only stand-in for vLLM, which OpenRLHF's Ray package imports at the top (``openrlhf/trainer/ray/
vllm_engine.py``) and which cannot be installed on a CPU machine next to the tests' torch.  It holds the three names
that module imports; the tests never create a vLLM engine, and any other use raises."""

__version__ = "0+cpu-test-stand-in"


def __getattr__(name: str):
    raise ImportError(f"vllm.{name}: vLLM is not installed on a CPU (test stand-in)")
