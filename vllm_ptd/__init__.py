"""vllm-ptd: Progressive Tree Drafting (arXiv 2607.10661) as a vLLM speculative method.

Kept import-light on purpose: vLLM loads the plugin entry point in every process, and the
CPU-compat hook imports this package at interpreter start-up.
"""

__version__ = "0.1.0"
