"""How far ``tflms.zoo.gpt2`` stands in for KerasHub's ``GPT2CausalLM``: weights and peak tensors.

Run by ``make bench`` (or ``python benchmarks/bench_kerashub_standin.py``).

Builds both models from the same configuration (no presets, nothing
downloaded) at two sizes: GPT-2 small itself (vocabulary 50257, 1024
positions, width 768, 12 blocks, batch 8) and the small configuration the
tests use (vocabulary 8192, 256 positions, width 256, 2 blocks, batch 4;
``tests/tflms/test_kerashub.py`` holds its ratio). For each it counts the
weights and simulates one AdamW training step (``tflms.simulate`` with
``accounting="tensors"``: the step's tensors, weights and optimizer slots
included, without the GPU's fixed terms, which would hide the difference).
Simulated, nothing trained. Writes ``benchmarks/results/kerashub_standin.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIZES = {
    "gpt2_small": dict(vocab=50257, seq=1024, dim=768, heads=12, layers=12, batch=8),
    "tests_config": dict(vocab=8192, seq=256, dim=256, heads=4, layers=2, batch=4),
}


def compare(vocab: int, seq: int, dim: int, heads: int, layers: int, batch: int) -> dict:
    """Both models at one size: weights, simulated peak tensor bytes, and their ratio."""
    import keras
    import keras_hub
    import numpy as np

    import tflms
    from tflms import zoo

    keras.utils.set_random_seed(0)
    ours = zoo.gpt2(vocab=vocab, seq=seq, dim=dim, heads=heads, layers=layers)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab,
        num_layers=layers,
        num_heads=heads,
        hidden_dim=dim,
        intermediate_dim=4 * dim,
        max_sequence_length=seq,
    )
    hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    hub.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    tokens = np.ones((batch, seq), "int32")
    x = {"token_ids": tokens, "padding_mask": np.ones((batch, seq), bool)}
    peaks = {
        "zoo": tflms.simulate(tflms.analyze(ours, batch_size=batch), accounting="tensors"),
        "kerashub": tflms.simulate(
            tflms.analyze(hub, batch_size=batch, x=x, y=tokens), accounting="tensors"
        ),
    }
    row = {
        "config": dict(vocab=vocab, seq=seq, dim=dim, heads=heads, layers=layers, batch=batch),
        "weights": {"zoo": ours.count_params(), "kerashub": hub.count_params()},
        "peak_tensor_mib": {k: round(r.device_peak_bytes / 2**20, 1) for k, r in peaks.items()},
        "peak_op_type": {k: r.peak_op_type for k, r in peaks.items()},
    }
    row["kerashub_peak_vs_zoo"] = round(
        peaks["kerashub"].device_peak_bytes / peaks["zoo"].device_peak_bytes, 3
    )
    keras.backend.clear_session()
    return row


def main() -> None:
    from benchmarks.common import provenance, write_result

    result = {
        **provenance("tflms.simulate, accounting='tensors': KerasHub's GPT-2 beside the zoo's"),
        "sizes": {name: compare(**size) for name, size in SIZES.items()},
    }
    print(write_result("kerashub_standin.json", result))


if __name__ == "__main__":
    main()
