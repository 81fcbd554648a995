"""Visual explanation for metric learning (Zhu et al., "Visual Explanation for Deep Metric Learning", IEEE TIP 2021);
docs/methods/explanation.md and docs/explain.md."""

from .activation_decomposition import ActivationDecomposition
from .base import RandomExplainer, SimilarityExplainer
from .composite_localization_dataset import CompositeLocalizationDataset
from .diagnostics import coarse_map_warning, collapse_warning, mean_pairwise_cosine
from .explanation_hook import ExplanationHook
from .fidelity import SimilarityFidelity
from .folded_embedding import FoldedEmbedding
from .head_folder import HeadFolder
from .localization_evaluator import LocalizationEvaluator
from .map_utils import normalize_maps, point_weights, resize_maps
from .orientation_estimator import OrientationEstimator
from .partial_similarity_retrieval import PartialSimilarityRetrieval
from .similarity_grad_cam import SimilarityGradCAM
from .topk_maps import explain_retrieval, topk_overall_maps

__all__ = [
    "ActivationDecomposition",
    "CompositeLocalizationDataset",
    "ExplanationHook",
    "FoldedEmbedding",
    "HeadFolder",
    "LocalizationEvaluator",
    "OrientationEstimator",
    "PartialSimilarityRetrieval",
    "RandomExplainer",
    "SimilarityExplainer",
    "SimilarityFidelity",
    "SimilarityGradCAM",
    "coarse_map_warning",
    "collapse_warning",
    "explain_retrieval",
    "mean_pairwise_cosine",
    "normalize_maps",
    "point_weights",
    "resize_maps",
    "topk_overall_maps",
]
