"""The token tree of SSD's pre-speculation: every branch drafted at once, one forward per depth over all of them.

Each branch (k, t) continues the committed prefix with the first k drafted tokens and t; all branches share the
prefix's KV cache and see it through one 4D attention mask per depth. ``ssd.core.speculation`` drafts with it
(``branch_drafts``); ``ssd.bench.profile`` times one depth of it, as SSD runs it.
"""
from __future__ import annotations

import torch

from .cached_model import CachedModel, additive_mask
from .static_cache import rows_bucket
from .proposers import Draft
from .sampling import draw, probs_from_logits, saguaro


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


def tree_mask(prefix_visible: torch.Tensor, depth: int, dtype, widen=None) -> torch.Tensor:
    """Additive [b, 1, N, base + (depth + 1) N] mask for the depth-th forward over N branches of each of b rows.

    Branch j of a row sees the prefix slots prefix_visible[row, j] ([b, N, base]) marks and its own nodes of depths
    0..depth; tree slots are laid out depth by depth, N per depth. Made on prefix_visible's device, in the model's
    dtype. widen (CachedModel.widen): pads the slots to as many as attention reads (the cache's bucket).
    """
    b, n, device = prefix_visible.shape[0], prefix_visible.shape[1], prefix_visible.device
    own = torch.eye(n, dtype=torch.bool, device=device).repeat(1, depth + 1)  # [N, (depth + 1) N]
    visible = torch.cat([prefix_visible, own.expand(b, -1, -1)], dim=2)  # [b, N, base + (depth + 1) N]
    return additive_mask(widen(visible) if widen else visible, dtype)[:, None]


@torch.inference_mode()
def draft_tree(draft: CachedModel, prefix_lens: dict[int, int], outcomes: dict[int, list], u: dict[int, torch.Tensor],
               temperature: float, c: float, fan_out: dict[int, tuple[int, ...]]) -> dict[int, list[Draft]]:
    """Draft len(u[row]) tokens for every outcome (k, t) of every row at once: one forward per depth, over all rows
    and all their branches (a row with fewer branches is padded, as is a row not in `outcomes`).

    The draft's cache holds each row's prefix + x_1..x_K. Branch (k, t) continues prefix + x_1..x_k + t, so its nodes
    see the prefix and the first k chain tokens, then their own earlier nodes. A row's branches are drawn with its
    u and Saguaro's q for its fan_out (the F_0..F_K of the round it drafts for). Returns each row's Drafts, one per
    outcome, in order.
    """
    model, base, device, b = draft.model, draft.slots, draft.device, draft.batch
    n = max(len(branches) for branches in outcomes.values())
    n = rows_bucket(n) if draft.fixed_shapes else n  # in fixed shapes, N is a bucket (the spare branches padding)
    index = {row: draft.rows.index(row) for row in outcomes}  # the row's place in the cache's batch
    # Made on the draft's device once: only the uniforms come in per depth, the tokens go out once at the end.
    ks = torch.zeros(b, n, dtype=torch.long)  # [b, N] accepted count of each branch's outcome
    feed = torch.zeros(b, n, dtype=torch.long)  # [b, N] fed at this depth: t*, then each branch's draft
    starts = torch.zeros(b, 1, dtype=torch.long)  # [b, 1] each row's prefix length
    for row, branches in outcomes.items():
        ks[index[row], : len(branches)] = torch.tensor([k for k, _ in branches])
        feed[index[row], : len(branches)] = torch.tensor([t for _, t in branches])
        starts[index[row]] = prefix_lens[row]
    valid = draft.padded(draft.valid)  # [b, base] (a dead row's slots all invalid)
    logical = valid.cumsum(1) - 1  # [b, base] the position each slot holds in its row
    prefix_visible = valid[:, None, :] & (logical[:, None, :] < (starts + ks)[:, :, None])  # [b, N, base]
    prefix_visible, ks, feed, starts = prefix_visible.to(device), ks.to(device), feed.to(device), starts.to(device)
    drawn = {row: ([], [], []) for row in outcomes}  # per row: tokens [N_row], q [N_row, V], logits [N_row, V]
    depths = max(len(u[row]) for row in outcomes)
    draft.cache.reserve(base + depths * n)  # the bucket the whole tree lands in, before any mask is made as wide
    for depth in range(depths):
        draft.cache.place(n)  # this depth's N slots per row, after the earlier depths'
        out = model(
            input_ids=feed,  # [b, N]
            attention_mask=tree_mask(prefix_visible, depth, model.dtype, draft.widen),  # [b, 1, N, slots]
            position_ids=starts + ks + depth,  # [b, N]
            cache=draft.cache,
            use_cache=True,
        )
        logits = out.logits.float()  # [b, N, V]
        for row, branches in outcomes.items():
            if depth < len(u[row]):
                row_logits = logits[index[row], : len(branches)]  # [N_row, V]
                q = saguaro_q(row_logits, temperature, fan_out[row][depth], c)  # [N_row, V]
                tokens = draw(q, u[row][depth].expand(len(branches)), temperature == 0)  # [N_row]
                feed[index[row], : len(branches)] = tokens.to(device)
                for kept, value in zip(drawn[row], (tokens, q, row_logits)):
                    kept.append(value)
    draft.truncate(base)
    return {row: _drafts(*drawn[row], fan_out[row]) for row in outcomes}


def _drafts(tokens: list, q_rows: list, logit_rows: list, fan_out) -> list[Draft]:
    """One row's branches as Drafts, from its per-depth tokens [N], q [N, V] and logits [N, V]."""
    tokens = torch.stack(tokens, 1).tolist()  # [N, K], read back once
    q_rows, logit_rows = torch.stack(q_rows, 1), torch.stack(logit_rows, 1)  # [N, K, V] each
    return [Draft(tokens[i], q_rows[i], logit_rows[i], tuple(fan_out), source="cache") for i in range(len(tokens))]
