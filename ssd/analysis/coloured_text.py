"""A generated text coloured by where each token came from: accepted (drafted and kept), recovered (from the residual
at the first rejection), bonus (after all K accepted) or the target's own (AR)."""
from __future__ import annotations

import html

from ..bench.frames import token_roles
from ..core.verify import ROLES

# Token roles (ssd.core.verify.ROLES) and their colours (backgrounds, light enough to read black text on).
ROLE_COLOURS = {"accepted": "#b7e4b0", "recovered": "#ffcc80", "bonus": "#a8d1f5", "target": None}
ROLE_HELP = {
    "accepted": "drafted token the target accepted",
    "recovered": "target token from the residual at the first rejection",
    "bonus": "target token after all K drafted tokens were accepted",
    "target": "token of a round that drafted nothing (autoregressive)",
}



# --- the text, coloured by role -------------------------------------------------------------------------------------

def token_pieces(tokenizer, tokens) -> list[str]:
    """The text each token adds, by decoding growing prefixes (a token may be half a character: its text goes to
    the token that completes it). tokenizer None (tiny random pairs): the ids themselves."""
    if tokenizer is None:
        return [f"{t} " for t in tokens]
    pieces, previous = [], ""
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1])
        if text.endswith("\ufffd") and i + 1 < len(tokens):
            pieces.append("")  # an incomplete UTF-8 sequence so far
            continue
        pieces.append(text[len(previous):] if text.startswith(previous) else tokenizer.decode(tokens[i : i + 1]))
        previous = text
    return pieces


def _as_ids(tokens) -> list[int]:
    if hasattr(tokens, "tolist"):
        tokens = tokens.tolist()
    tokens = list(tokens)
    if len(tokens) == 1 and isinstance(tokens[0], (list, tuple)):
        tokens = list(tokens[0])
    return [int(t) for t in tokens]


def _span(text: str, role: str, title: str | None = None) -> str:
    colour = ROLE_COLOURS[role]
    style_ = f"background:{colour};" if colour else "color:#555;"
    title_attr = f' title="{html.escape(title)}"' if title else ""
    return f'<span class="ssd-{role}" style="{style_}border-radius:2px"{title_attr}>{html.escape(text)}</span>'


def coloured_tokens_html(tokenizer, tokens, rounds) -> str:
    """The HTML string `coloured_tokens` displays."""
    ids = _as_ids(tokens)
    roles = token_roles(rounds)
    if len(roles) != len(ids):
        raise ValueError(f"rounds account for {len(roles)} new tokens but tokens has {len(ids)}: pass the new token "
                         f"ids and rounds_frame(trace) of the same generate call")
    pieces = token_pieces(tokenizer, ids)
    counts = {r: roles.count(r) for r in ROLES}
    legend = " ".join(_span(f"{r} ({counts[r]})", r, ROLE_HELP[r]) for r in ROLES)
    body = "".join(_span(p, r, f"{r}, id {t}") for p, r, t in zip(pieces, roles, ids))
    return ('<div class="ssd-tokens">'
            f'<div style="font-size:smaller;margin-bottom:6px">{legend}</div>'
            f'<div style="white-space:pre-wrap;font-family:monospace;line-height:1.6">{body}</div></div>')


def coloured_tokens(tokenizer, tokens, rounds):
    """The generated text, each token coloured by its role (accepted green, recovered orange, bonus blue, target
    plain), HTML-escaped, newlines kept, with a legend. tokens: the new token ids; rounds: rounds_frame(trace) (or the
    Trace) of the same call."""
    from IPython.display import HTML

    return HTML(coloured_tokens_html(tokenizer, tokens, rounds))


