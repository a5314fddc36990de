"""PTD attention glue: per-step tree metadata and the Triton tree-attention backend.

``tree_metadata`` is import-light (torch only); ``triton_tree_backend`` imports vLLM
and Triton, so import it only where the backend is registered.
"""
