"""The token tree of SSD's pre-speculation: every branch drafted at once, one forward per depth over all of them.

Each branch (k, t) continues the committed prefix with the first k drafted tokens and t; all branches share the
prefix's KV cache and see it through one 4D attention mask per depth. ``ssd.ssd`` drafts with it (``branch_drafts``);
``ssd.profile`` times one depth of it, as SSD runs it.
"""
from __future__ import annotations

import torch

from .cached_model import CachedModel
from .proposers import Draft
from .sampling import probs_from_logits, sample_from_uniform, saguaro


def saguaro_q(logits: torch.Tensor, temperature: float, f: int, c: float) -> torch.Tensor:
    """The draft distribution at a position whose cache holds f candidates: Saguaro down-weights the top f + 1.

    The drafted token is usually the top one and is never a candidate, so the top f + 1 are the tokens the cache
    will cover there (as in the official code). At temperature 0 the greedy draft is left alone.
    logits: [..., V] -> q [..., V].
    """
    q = probs_from_logits(logits, temperature)
    if temperature == 0 or c == 1.0 or f == 0:
        return q
    return saguaro(q, torch.topk(logits, min(f + 1, logits.shape[-1]), dim=-1).indices, c)


def tree_mask(prefix_visible: torch.Tensor, depth: int, dtype) -> torch.Tensor:
    """Additive [1, 1, N, base + (depth + 1) N] mask for the depth-th forward over N branches.

    Branch b sees the prefix columns prefix_visible[b] ([N, base]) marks and its own nodes of depths 0..depth; tree
    columns are laid out depth by depth, N per depth. Made on prefix_visible's device, in the model's dtype.
    """
    n, device = prefix_visible.shape[0], prefix_visible.device
    own = torch.eye(n, dtype=torch.bool, device=device).repeat(1, depth + 1)  # [N, (depth + 1) N]
    visible = torch.cat([prefix_visible, own], dim=1)  # [N, base + (depth + 1) N]
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def draft_tree(draft: CachedModel, prefix_len: int, outcomes, u: torch.Tensor, temperature: float, c: float,
               fan_out) -> list[Draft]:
    """Draft len(u) tokens for every outcome (k, t) at once: len(u) forwards, each over all N branches in one row.

    The draft's cache holds prefix + x_1..x_K (base positions). Branch (k, t) continues prefix + x_1..x_k + t, so its
    nodes see the prefix and the first k chain tokens, then their own earlier nodes. Each branch is drawn with
    Saguaro's q for `fan_out` (the F_0..F_K of the round it drafts for). Returns one Draft per outcome.
    """
    model, base, device = draft.model, draft.length, draft.device
    # Made on the draft's device once: only the uniforms come in per depth, the tokens go out once at the end.
    ks = torch.tensor([k for k, _ in outcomes], device=device)  # [N] accepted count of each branch's outcome
    feed = torch.tensor([t for _, t in outcomes], device=device)  # [N] fed at this depth: t*, then each branch's draft
    prefix_visible = torch.arange(base, device=device)[None, :] < (prefix_len + ks)[:, None]  # [N, base]
    tokens, q_rows, logit_rows = [], [], []
    for depth in range(len(u)):
        out = model(
            input_ids=feed[None].to(device),  # [1, N]; a no-op, but on MPS, which samples on the CPU (ssd.sampling)
            attention_mask=tree_mask(prefix_visible, depth, model.dtype),  # [1, 1, N, base + (depth + 1) N]
            position_ids=(prefix_len + ks + depth)[None],  # [1, N]
            cache=draft.cache,
            use_cache=True,
        )
        logits = out.logits[0].float()  # [N, V]
        q = saguaro_q(logits, temperature, fan_out[depth], c)  # [N, V]
        feed = sample_from_uniform(q, u[depth].expand(len(outcomes)))  # [N]
        tokens.append(feed)
        q_rows.append(q)
        logit_rows.append(logits)
    draft.rollback(base)
    tokens = torch.stack(tokens, 1).tolist()  # [N, K], read back once
    q_rows, logit_rows = torch.stack(q_rows, 1), torch.stack(logit_rows, 1)  # [N, K, V] each
    return [Draft(tokens[i], q_rows[i], logit_rows[i], tuple(fan_out), source="cache") for i in range(len(outcomes))]
