"""What a run measures and its record: top-1, k-NN and per-layer / end-to-end fidelity
(`evaluate`), the test photos at native resolution with intervals (`photo_eval`; its forward
`photo_tokens`, its dense measure's k-means and probes `dense`, which photo a random crop came
from `crop_retrieval`), the teacher-feature cache, the typed results record (`results`,
results.json), the summary table the CLI prints (`summary`) and every plot (`plots`). May import
runtime, models and data; it knows no trainer, no export and no driver.
"""
