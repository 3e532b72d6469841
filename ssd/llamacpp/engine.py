"""One GGUF model in llama.cpp, driven through llama-cpp-python's low-level ctypes bindings: batches of tokens in
numbered sequences, logits at the positions asked for, and each sequence's KV entries removed or copied by
position; what the kit's AR peer and llama.cpp's profile are made of.

The bindings are the pure-Python ``llama_cpp`` package of the pinned build (``ssd.llamacpp.build``), pointed at the
build's libllama by ``LLAMA_CPP_LIB_PATH``. Its ``llama_cpp/__init__.py`` imports the high-level ``Llama`` class and
its dependencies (diskcache among them), which the kit never uses: ``bindings`` registers the package bare and loads
only the ctypes module.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import sys
import types

import numpy as np

from .build import LlamaCpp

PACKAGE = "llama_cpp"


def bindings(build: LlamaCpp):
    """llama_cpp.llama_cpp of this build, loaded once per process (a module, as Python keeps every import), with
    llama.cpp's log lines dropped: they would fill the bench's output at every model load."""
    if f"{PACKAGE}.llama_cpp" not in sys.modules:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(build.bin)
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(build.python / PACKAGE)]
        sys.modules[PACKAGE] = package
        module = importlib.import_module(f"{PACKAGE}.llama_cpp")
        module.llama_backend_init()
        package.quiet = module.llama_log_callback(lambda level, text, data: None)  # kept alive with the package
        module.llama_log_set(package.quiet, ctypes.c_void_p())
    return sys.modules[f"{PACKAGE}.llama_cpp"]


class Engine:
    """A model and one context over it: ``decode`` a batch, read ``logits`` or ``argmax`` at its output positions,
    ``remove`` or ``copy`` a sequence's entries. A context manager; close() frees the model."""

    def __init__(self, build: LlamaCpp, gguf, *, threads: int, n_ctx: int = 2048, sequences: int = 1,
                 n_batch: int = 512):
        self.ll = ll = bindings(build)
        params = ll.llama_model_default_params()
        self.model = ll.llama_model_load_from_file(str(gguf).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        ctx = ll.llama_context_default_params()
        ctx.n_ctx, ctx.n_batch, ctx.n_ubatch, ctx.n_seq_max = n_ctx, n_batch, n_batch, sequences
        ctx.n_threads = ctx.n_threads_batch = threads
        ctx.kv_unified = True  # sequences that share a prefix (a tree's branches) share one cache
        self.ctx = ll.llama_init_from_model(self.model, ctx)
        if not self.ctx:
            ll.llama_model_free(self.model)
            raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} tokens for {gguf}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.threads, self.n_batch = threads, n_batch
        self.batch = ll.llama_batch_init(n_batch, 0, sequences)
        self.outputs: list[int] = []  # the batch index of each output position of the last decode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.ctx:
            self.ll.llama_batch_free(self.batch)
            self.ll.llama_free(self.ctx)
            self.ll.llama_model_free(self.model)
            self.ctx = self.model = None

    def decode(self, tokens: list[int], positions: list[int], sequences: list[int], outputs: list[bool]) -> None:
        """One forward over a batch: token i at position i of sequence i, its logits kept where outputs[i]."""
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"a batch holds 1 to {self.n_batch} tokens; given {n}")
        b = self.batch
        b.n_tokens = n
        for i, (token, pos, seq, out) in enumerate(zip(tokens, positions, sequences, outputs)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, out
            b.seq_id[i][0] = seq
        if (code := self.ll.llama_decode(self.ctx, b)) != 0:
            raise RuntimeError(f"llama_decode returned {code} on a batch of {n} tokens")
        self.outputs = [i for i, out in enumerate(outputs) if out]

    def logits(self, i: int) -> np.ndarray:
        """The logits after batch position i of the last decode (a view into llama.cpp's buffer, float32)."""
        pointer = self.ll.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def argmax(self, i: int) -> int:
        return int(np.argmax(self.logits(i)))

    def top_two(self, i: int) -> tuple[int, float, float]:
        """The greedy token after batch position i, its logit and its lead over the runner-up (a near-tie where
        small: another way of computing the logits, a pass over several tokens, may pick the other)."""
        logits = self.logits(i)
        token = int(np.argmax(logits))  # the first of equal maxima, as argmax everywhere else
        top = float(logits[token])
        # the runner-up as the largest of the rest: two passes over the vocabulary, 0.03 ms for Qwen's 151,936
        # logits where a partition takes 1.7 (5% of llama.cpp's step on two cores, which AR's clock would carry)
        logits[token] = -np.inf
        second = float(logits.max())
        logits[token] = top  # llama.cpp's own buffer: as it was
        return token, top, top - second

    def remove(self, sequence: int, start: int, end: int = -1) -> None:
        """Drop a sequence's entries at positions [start, end) (end -1: to its end)."""
        self.ll.llama_memory_seq_rm(self.ll.llama_get_memory(self.ctx), sequence, start, end)

    def copy(self, source: int, dest: int, start: int = -1, end: int = -1) -> None:
        """Let sequence dest see source's entries at [start, end) (-1: from the start / to the end), sharing them."""
        self.ll.llama_memory_seq_cp(self.ll.llama_get_memory(self.ctx), source, dest, start, end)

    def clear(self) -> None:
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)

    def synchronize(self) -> None:
        self.ll.llama_synchronize(self.ctx)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenization of a text, special tokens parsed, as its tools read a prompt."""
        data = text.encode()
        out = (self.ll.llama_token * (len(data) + 8))()
        n = self.ll.llama_tokenize(self.vocab, data, len(data), out, len(out), True, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} slots")
        return list(out[:n])

    def is_end(self, token: int) -> bool:
        return bool(self.ll.llama_vocab_is_eog(self.vocab, token))
