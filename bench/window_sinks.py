"""What the side-by-side benchmarks (bench/fwd, bench/bwd) need for their window + sink tokens row: FlexAttention as
the peer that takes that mask, and the useful FLOPs' pair count."""
import torch


def flex(window, sink_tokens):
    """FlexAttention (compiled) with a causal window of `window` keys plus the first `sink_tokens` keys, on tensors in
    flashlite's [B, S, H, D] layout (one block mask per sequence length)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention)
    cache = {}

    def fwd(q, k, v):
        S = q.shape[1]
        if S not in cache:
            def mask(b, h, i, j):
                return (j <= i) & ((j >= i - window) | (j < sink_tokens))
            cache[S] = create_block_mask(mask, None, None, S, S, device="cuda")
        return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        block_mask=cache[S]).transpose(1, 2)
    return fwd


def visible_pairs(S, causal, window, sink_tokens):
    """(query, key) pairs the mask leaves visible in an S x S problem (window < 0: none)."""
    i = torch.arange(S, device="cuda")[:, None]
    j = torch.arange(S, device="cuda")[None, :]
    vis = torch.ones(S, S, dtype=torch.bool, device="cuda")
    if causal:
        vis &= j <= i
    if window >= 0:
        vis &= (j >= i - window) | (j < sink_tokens)
    return vis.sum().item()
