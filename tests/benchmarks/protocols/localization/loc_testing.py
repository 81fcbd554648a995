"""Hand-made units of the localization protocol (no model): per seed and loss the accuracies of every method and
convention (at the held-out threshold, and the test images' own best 2.5 points above it), P@1, the identity check;
per seed the centre box (5 at its held-out side, 7.5 at the test images' best), thresholds and map size."""

from benchmarks.protocols.localization.maps import CONVENTIONS, DEMO, METHODS

# held-out-threshold accuracies per seed: Decomposition signed 40/50/60, ReLU 45/50/70; Grad-CAM ReLU 10/20/30;
# others 0; the test-picked best is each + OPTIMISM
OPTIMISM = 2.5
BASE = {
    "Decomposition [signed]": [40, 50, 60],
    "Decomposition [ReLU]": [45, 50, 70],
    "Grad-CAM [ReLU]": [10, 20, 30],
}


def hand_units():
    """``{seed: {loss: unit}}`` and ``runs`` (``{seed: {"losses", "centre_box", "thresholds", "feature_size",
    ...}}``) as the protocol writes them; Triplet is MS shifted by -5."""
    units, runs = {}, {}
    for i, s in enumerate((0, 1, 2)):
        losses = {}
        for loss, shift in (("ms", 0.0), ("triplet", -5.0)):
            scores = {}
            for m in METHODS + (DEMO,):
                for conv in CONVENTIONS:
                    if m == DEMO and conv == "ReLU":
                        continue
                    k = f"{m} [{conv}]"
                    acc = BASE.get(k, [0, 0, 0])[i] + shift
                    scores[k] = {
                        "held_out_accuracy": acc,
                        "held_out_threshold": 0.5,
                        "best_accuracy": acc + OPTIMISM,
                        "best_threshold": 0.45,
                        "accuracy": [acc] * 19,
                    }
            losses[loss] = {
                "scores": scores,
                "identity_rgradcam_vs_relu_decomposition_bias": {
                    "n_pairs": 2,
                    "max_rel_diff_relu": 0.0,
                    "same_hits_every_threshold": True,
                },
                "train_p_at_1": 90.0 + i,
                "test_p_at_1": 50.0 + i + shift,
                "feature_size": [8, 8],
                "seconds": 10.0,
            }
        units[s] = losses
        runs[s] = {
            "losses": losses,
            "centre_box": {
                "held_out_accuracy": 5.0,
                "held_out_fraction": 0.5 + 0.05 * i,
                "best_accuracy": 5.0 + OPTIMISM,
            },
            "thresholds": [0.05 * k for k in range(1, 20)],
            "feature_size": [8, 8],
            "n_train": 3,
            "n_test": 3,
            "n_validation": 2,
            "image_size": [256, 256],
        }
    return units, runs
