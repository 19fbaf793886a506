"""Test-only stand-in (see ``vllm/__init__.py``): the name OpenRLHF imports at the top of its vLLM engine module."""


def random_uuid() -> str:
    raise NotImplementedError("vLLM is not installed on a CPU (test stand-in)")
