"""What a run measures and its record: top-1, k-NN and per-layer / end-to-end fidelity
(`evaluate`), the test photos at native resolution with intervals and the dense measure
(`photo_eval`), the teacher-feature cache and the typed results record (`results`, results.json).
May import runtime, models and data; it knows no trainer, no export and no driver.
"""
