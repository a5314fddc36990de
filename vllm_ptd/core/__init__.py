"""Engine-independent PTD core: draft tree, draft pool, layout, verification, reference driver."""

from vllm_ptd.core.layout import TreeLayout
from vllm_ptd.core.request_state import PTDRequestState
from vllm_ptd.core.verify import VerifyResult, processed_probs, verify_greedy, verify_walk

__all__ = [
    "PTDRequestState",
    "TreeLayout",
    "VerifyResult",
    "processed_probs",
    "verify_greedy",
    "verify_walk",
]
