"""MAUVE between synthetic and real text features, with MAUVE* and repeats over seeds.

The recipe (Pillutla et al. 2021; the paper's choices): L2-normalise the features of both sets,
fit PCA on their union and keep the leading components that explain `explained_variance` (0.9)
of the variance, cluster the union with k-means into `num_buckets` buckets (`auto`: n / 10 with
n the smaller set, capped at `max_buckets`), histogram each set over the buckets, and score the
two histograms with the divergence frontier of `divergence.py` (scaling c = 5, a 25-point
curve). `mauve_star` is the same with Krichevsky-Trofimov smoothed histograms (Pillutla et al.,
JMLR 2023), less biased for small samples.

k-means runs in `faiss` when it is installed (as the reference `mauve-text` does, with the same
seed conventions: PCA seed + 1, k-means seed + 2, so the two agree on the same features), else in
scikit-learn. Scores are repeated over seeds and (optionally) random subsamples and reported as
mean and standard deviation.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from dpsynth.errors import DpsynthError
from dpsynth.evaluate import divergence

logger = logging.getLogger("dpsynth")
AUTO = "auto"
FAISS_MIN_POINTS_PER_CENTROID = 39  # faiss's ClusteringParameters default: it warns below it
EXAMPLES_PER_BUCKET = 10  # the `auto` heuristic: num_buckets = n / 10
MIN_EXAMPLES = 2


class TooFewExamplesError(DpsynthError, ValueError):
    """Not enough examples for the requested number of buckets."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MauveConfig:
    """MAUVE settings; the defaults are the paper's and `mauve-text`'s.

    Attributes:
      num_buckets: "auto" (n / 10, n = size of the smaller set) or a fixed count.
      max_buckets: cap on the number of buckets (applies to "auto" and fixed counts).
      explained_variance: fraction of variance the PCA projection keeps, in (0, 1).
      kmeans_num_redo: k-means restarts (the best objective is kept).
      kmeans_max_iter: k-means iterations per restart.
      num_points: points of the divergence curve.
      scaling: the constant c of exp(-c KL).
      seed: base seed (PCA uses seed + 1, k-means seed + 2, as `mauve-text`).
      backend: "auto" (faiss if installed, else sklearn), "faiss" or "sklearn".
    """

    num_buckets: int | str = AUTO
    max_buckets: int = 500
    explained_variance: float = 0.9
    kmeans_num_redo: int = 5
    kmeans_max_iter: int = 500
    num_points: int = divergence.DEFAULT_NUM_POINTS
    scaling: float = divergence.DEFAULT_SCALING
    seed: int = 25
    backend: str = AUTO

    def __post_init__(self):
        if self.num_buckets != AUTO and not (isinstance(self.num_buckets, int) and self.num_buckets >= 2):
            raise ValueError(f"num_buckets must be 'auto' or an int >= 2, got {self.num_buckets!r}")
        if self.max_buckets < 2:
            raise ValueError(f"max_buckets must be >= 2, got {self.max_buckets}")
        if not 0.0 < self.explained_variance < 1.0:
            raise ValueError(f"explained_variance must be in (0, 1), got {self.explained_variance}")
        if self.kmeans_num_redo < 1 or self.kmeans_max_iter < 1:
            raise ValueError("kmeans_num_redo and kmeans_max_iter must be >= 1")
        if self.num_points < 2 or self.scaling <= 0:
            raise ValueError("num_points must be >= 2 and scaling > 0")
        if self.backend not in (AUTO, "faiss", "sklearn"):
            raise ValueError(f"backend must be 'auto', 'faiss' or 'sklearn', got {self.backend!r}")

    def buckets_for(self, n_p: int, n_q: int) -> int:
        """The number of buckets for sets of n_p and n_q examples (raises when too few)."""
        n = min(n_p, n_q)
        if n < MIN_EXAMPLES:
            raise TooFewExamplesError(f"MAUVE needs >= {MIN_EXAMPLES} examples per set, got {n_p} and {n_q}")
        if self.num_buckets == AUTO:
            return int(min(self.max_buckets, max(2, int(round(n / EXAMPLES_PER_BUCKET)))))
        k = int(min(self.num_buckets, self.max_buckets))
        if n < k:
            raise TooFewExamplesError(
                f"too few examples for {k} buckets: the sets have {n_p} and {n_q} examples (need >= {k} each); "
                f"use num_buckets='auto' (n/{EXAMPLES_PER_BUCKET}) or fewer buckets")
        return k


@dataclasses.dataclass(frozen=True)
class MauveResult:
    """One MAUVE computation: scores, histograms and curves (P = synthetic, Q = real)."""

    mauve: float
    mauve_star: float
    frontier_integral: float
    frontier_integral_star: float
    num_buckets: int
    pca_dim: int
    p_hist: np.ndarray
    q_hist: np.ndarray
    curve: np.ndarray


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (all-zero rows stay zero, as sklearn's `normalize`)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def pca_project(x: np.ndarray, explained_variance: float) -> np.ndarray:
    """Projects x onto the fewest leading principal components explaining the given fraction."""
    centered = x - x.mean(axis=0, keepdims=True)
    n, d = centered.shape
    if n > d:  # eigen-decomposition of the d x d scatter matrix: cheaper than an SVD of n x d
        evals, evecs = np.linalg.eigh(centered.T @ centered)
        order = np.argsort(evals)[::-1]
        evals, components = np.clip(evals[order], 0, None), evecs[:, order]
    else:
        _, s, vt = np.linalg.svd(centered, full_matrices=False)
        evals, components = s**2, vt.T
    total = evals.sum()
    if total <= 0:
        return centered[:, :1]
    keep = int(np.argmax(np.cumsum(evals) / total >= explained_variance)) + 1
    return centered @ components[:, :keep]


def _kmeans_labels(data: np.ndarray, k: int, config: MauveConfig, seed: int) -> np.ndarray:
    backend = config.backend
    if backend == AUTO:
        try:
            import faiss  # noqa: F401
            backend = "faiss"
        except ImportError:
            backend = "sklearn"
    data = np.ascontiguousarray(data, dtype=np.float32)
    if backend == "faiss":
        import faiss

        # faiss prints "WARNING clustering N points to K centroids" (C++, on stderr) below
        # FAISS_MIN_POINTS_PER_CENTROID points per centroid; that bound changes nothing else in
        # its k-means, so it is lowered to 1 and the fact is logged as dpsynth's own (--verbose) line.
        if len(data) < k * FAISS_MIN_POINTS_PER_CENTROID:
            logger.debug("mauve: clustering %d points to %d centroids (fewer than %d per centroid)",
                         len(data), k, FAISS_MIN_POINTS_PER_CENTROID)
        kmeans = faiss.Kmeans(data.shape[1], k, niter=config.kmeans_max_iter, verbose=False,
                              nredo=config.kmeans_num_redo, update_index=True, seed=seed + 2,
                              min_points_per_centroid=1)
        kmeans.train(data)
        _, labels = kmeans.index.search(data, 1)
        return labels.reshape(-1)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, n_init=config.kmeans_num_redo, max_iter=config.kmeans_max_iter, random_state=seed + 2)
    return km.fit_predict(data)


def quantize(p_features: np.ndarray, q_features: np.ndarray, num_buckets: int, config: MauveConfig,
             seed: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Bucket counts of P and Q over k-means clusters of their (normalised, projected) union.

    Returns:
      (p_counts[num_buckets], q_counts[num_buckets], pca_dim).
    """
    seed = config.seed if seed is None else seed
    data = l2_normalize(np.vstack([q_features, p_features]))
    data = pca_project(data, config.explained_variance)
    labels = _kmeans_labels(data, num_buckets, config, seed)
    n_q = len(q_features)
    q_counts = np.bincount(labels[:n_q], minlength=num_buckets).astype(np.float64)
    p_counts = np.bincount(labels[n_q:], minlength=num_buckets).astype(np.float64)
    return p_counts, q_counts, int(data.shape[1])


def _check_features(name: str, x) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"{name}: expected a non-empty [n, d] feature array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: features contain NaN or inf")
    return x


def compute_mauve(p_features, q_features, config: MauveConfig = MauveConfig(), seed: int | None = None) -> MauveResult:
    """MAUVE and MAUVE* of P (synthetic) against Q (real) from precomputed features."""
    p_features = _check_features("p_features", p_features)
    q_features = _check_features("q_features", q_features)
    if p_features.shape[1] != q_features.shape[1]:
        raise ValueError(f"feature dims differ: {p_features.shape[1]} vs {q_features.shape[1]}")
    k = config.buckets_for(len(p_features), len(q_features))
    p_counts, q_counts, pca_dim = quantize(p_features, q_features, k, config, seed)
    scores = divergence.compare_counts(p_counts, q_counts, config.num_points, config.scaling)
    return MauveResult(
        mauve=scores.mauve, mauve_star=scores.mauve_star, frontier_integral=scores.frontier_integral,
        frontier_integral_star=scores.frontier_integral_star, num_buckets=k, pca_dim=pca_dim,
        p_hist=divergence.normalize(p_counts), q_hist=divergence.normalize(q_counts), curve=scores.curve)


@dataclasses.dataclass(frozen=True)
class MauveSummary:
    """Mean and (population) standard deviation of MAUVE and MAUVE* over repeats."""

    mauve_mean: float
    mauve_std: float
    mauve_star_mean: float
    mauve_star_std: float
    num_buckets: int
    runs: tuple[MauveResult, ...]

    def as_dict(self, prefix: str = "mauve") -> dict[str, float]:
        return {f"{prefix}": self.mauve_mean, f"{prefix}_std": self.mauve_std,
                f"{prefix}_star": self.mauve_star_mean, f"{prefix}_star_std": self.mauve_star_std,
                f"{prefix}_buckets": self.num_buckets, f"{prefix}_runs": len(self.runs)}


def mauve_repeated(p_features, q_features, config: MauveConfig = MauveConfig(), seeds: Sequence[int] = (0, 1, 2),
                   subsample: int | None = None) -> MauveSummary:
    """MAUVE over seeds, each on an independent random subsample of `subsample` rows per set.

    With `subsample=None` every repeat uses all rows and only the clustering seed changes.
    """
    p_features = _check_features("p_features", p_features)
    q_features = _check_features("q_features", q_features)
    if not seeds:
        raise ValueError("seeds must be non-empty")
    runs = []
    for seed in seeds:
        p, q = p_features, q_features
        if subsample is not None:
            if subsample > min(len(p), len(q)):
                raise TooFewExamplesError(f"subsample={subsample} exceeds the set sizes {len(p)} and {len(q)}")
            rng = np.random.default_rng(seed)
            p = p[rng.choice(len(p), subsample, replace=False)]
            q = q[rng.choice(len(q), subsample, replace=False)]
        runs.append(compute_mauve(p, q, config, seed=config.seed + seed))
    m = np.array([r.mauve for r in runs])
    s = np.array([r.mauve_star for r in runs])
    return MauveSummary(float(m.mean()), float(m.std()), float(s.mean()), float(s.std()), runs[0].num_buckets, tuple(runs))
