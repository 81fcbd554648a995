"""Visual explanation for metric learning (Zhu et al., "Visual Explanation for Deep Metric Learning", IEEE TIP
2021).

``ActivationDecomposition`` explains a similarity through the last convolutional feature maps (point-to-point,
overall and point-specific maps), ``SimilarityGradCAM`` gives the Grad-CAM baselines,
``LocalizationEvaluator`` and ``CompositeLocalizationDataset`` measure weakly supervised localisation,
``PartialSimilarityRetrieval`` does region-of-interest retrieval, ``OrientationEstimator`` cross-view
orientation, and ``ExplanationHook`` plugs the maps into a PML tester.
"""

from .activation_decomposition import ActivationDecomposition
from .composite_localization_dataset import CompositeLocalizationDataset
from .explanation_hook import ExplanationHook
from .folded_embedding import FoldedEmbedding
from .head_folder import HeadFolder
from .localization_evaluator import LocalizationEvaluator
from .map_utils import normalize_maps, point_weights, resize_maps
from .orientation_estimator import OrientationEstimator
from .partial_similarity_retrieval import PartialSimilarityRetrieval
from .similarity_grad_cam import SimilarityGradCAM
from .topk_maps import topk_overall_maps

__all__ = [
    "ActivationDecomposition",
    "CompositeLocalizationDataset",
    "ExplanationHook",
    "FoldedEmbedding",
    "HeadFolder",
    "LocalizationEvaluator",
    "OrientationEstimator",
    "PartialSimilarityRetrieval",
    "SimilarityGradCAM",
    "normalize_maps",
    "point_weights",
    "resize_maps",
    "topk_overall_maps",
]
