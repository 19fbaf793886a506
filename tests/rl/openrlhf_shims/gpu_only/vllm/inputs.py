"""Test-only stand-in (see ``vllm/__init__.py``): the name OpenRLHF imports at the top of its vLLM engine module."""


class TokensPrompt(dict):
    """Never built by the tests."""
