"""What context parallelism adds to one GPU's attention core: ring attention's or Ulysses' exchanges."""
from __future__ import annotations

from sim.hardware.kernels import precision_bytes
from sim.hardware.network import all_to_all_time, links_of, p2p_time
from sim.hardware.profile import DeviceProfile
from sim.model.transformer import Transformer

from .slice import Slice


def context_attention(m: Transformer, dev: DeviceProfile, x: Slice, core_f: float, core_i: float) -> tuple[float, float]:
    """Seconds context parallelism adds to the attention core's `core_f` (F) and `core_i` (the
    backward), the computes of one GPU's s/cp queries (Megatron-Core with Transformer Engine's
    context-parallel attention; docs/planner.md, "Context parallelism"):

    "p2p", ring attention: cp steps, each computing against one rank's K and V while the next
    send runs; c is a pass's compute / cp (load balanced: each rank holds chunks i and 2cp-1-i
    of 2cp, so every step is equal work) and k one send of K and V of s/cp tokens. F sends K and
    V on all steps but the last: c + (cp - 1) max(c, k). The backward sends K and V on the first
    step, K, V and their gradients (2k) on the middle ones, the gradients alone on the last
    (Transformer Engine's AttnFuncWithCPAndKVP2P.backward): 2 max(c, k) + (cp - 2) max(c, 2k).
    Added: what exceeds cp c.
    "a2a", Ulysses: Q, K, V go from s/cp tokens of all heads to all s of a/cp heads, and the
    output back, two all-to-alls each way, not overlapped with the compute. Under FP8 they move
    BF16 (Transformer Engine's attention stays BF16: `sim.cost.fp8`)."""
    if x.cp == 1:
        return 0.0, 0.0
    e, links, group = precision_bytes(x.activation_precision), links_of(dev), x.context_group
    kv = 2 * x.tokens(m) * m.hidden * m.kv_heads / m.heads / x.tp * e
    if x.cp_comm == "p2p":
        k, c_f, c_i = p2p_time(links, kv, group), core_f / x.cp, core_i / x.cp
        both = p2p_time(links, 2 * kv, group)
        return (x.cp - 1) * max(0.0, k - c_f), 2 * max(0.0, k - c_i) + (x.cp - 2) * max(0.0, both - c_i)
    q_and_out = 2 * x.tokens(m) * m.hidden / x.tp * e
    swaps = all_to_all_time(links, kv + q_and_out / 2, group) + all_to_all_time(links, q_and_out / 2, group)
    return swaps, swaps
